/* MPI_IN_PLACE is a macro (Open MPI: (void *)1, MPICH: (void *)-1); export its value. */
#include <mpi.h>

/* Open MPI's extensions header declares MPIX_Query_cuda_support (the cuda extension);
 * other MPIs may lack the header, so it is included only where the compiler finds it. */
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

void *zero_comm_mpi_in_place(void) { return MPI_IN_PLACE; }

/* Whether the MPI library can take CUDA device pointers, asked at run time:
 * 1 yes, 0 no, -1 this library has no way to say (no cuda extension). */
int zero_comm_cuda_support(void) {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
    return MPIX_Query_cuda_support() ? 1 : 0;
#else
    return -1;
#endif
}

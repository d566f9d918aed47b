//! Scenario: the NCCL unique id handed over MPI (zero-comm's `nccl_id::exchange`) with a
//! stand-in id, as `train --comm nccl` hands the real one: rank 0 makes 128 bytes that
//! depend on its process id (so no rank could guess them), every rank prints what it got.
//! Mode `fail`: rank 0 cannot make one; every rank must report an error, none may hang.

use zero_comm::nccl_id::{exchange, UniqueId, UNIQUE_ID_BYTES};
use zero_comm::Communicator;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (_ctx, world) = zero_comm::init().unwrap_or_else(|e| zero_comm::abort(&e.to_string(), 1));
    let got = exchange(&world, || {
        if mode == "fail" {
            return Err("stand-in: libnccl.so.2 not found".into());
        }
        let pid = std::process::id().to_le_bytes();
        let mut id = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in id.iter_mut().enumerate() {
            *b = pid[i % 4] ^ i as u8;
        }
        Ok(UniqueId(id))
    });
    match got {
        Ok(id) => println!("rank {} id {}", world.rank(), id.to_hex()),
        Err(e) => println!("rank {} error {e}", world.rank()),
    }
    println!("{}", zero_tests::ok_line(world.rank()));
}

//! The activation arena: one buffer, sized up front for the largest micro-batch, holding
//! every activation the backward needs plus the gradient scratch of one layer:
//!
//! ```text
//! [embed: x0 BTC][block 0 ...][block L-1 ...][head ...][recompute ...][scratch ...]
//! block: ln1 BTC | ln1_mean BT | ln1_rstd BT | qkv 3BTC | atty BTC | att BHTT | res2 BTC
//!        | ln2 BTC | ln2_mean BT | ln2_rstd BT | fch 4BTC | fcg 4BTC | res3 BTC
//! checkpointed block: res3 BTC
//! head:  lnf BTC | lnf_mean BT | lnf_rstd BT | probs BTV | losses BT
//! recompute: a block's pieces before res3 (only when some block is checkpointed)
//! scratch: dres BTC | dln BTC | dqkv 3BTC | datty BTC | dfch 4BTC | dp TT
//! ```
//!
//! Each block's output (`res3`) is the last thing in its region, so the input of block i
//! is the tail of everything before it: a layer's call views the regions before it to
//! read and its own to write (one device buffer, split into disjoint views). Every region
//! grows with B and T, so a smaller batch fits the arena laid out for a larger one.
//!
//! Activation checkpointing (`GptConfig::checkpoint_every` = k > 0): blocks 0, k, 2k, ...
//! keep only their output, which is the next layer's input; their internal activations
//! (the twelve pieces before `res3`) live in the one `recompute` region, written by the
//! block's forward and rewritten from the saved input by its backward (`gpt.rs`). At
//! k = 1 the blocks hold L x BTC plus one block's internals instead of L full regions.

/// Dimensions of one micro-batch's activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// B: rows.
    pub b: usize,
    /// T: this batch's sequence length.
    pub t: usize,
    /// C.
    pub c: usize,
    /// H.
    pub h: usize,
    /// V.
    pub v: usize,
    /// L.
    pub l: usize,
    /// Checkpoint every k-th block (blocks 0, k, 2k, ...); 0: none.
    pub every: usize,
}

impl Dims {
    /// B*T.
    pub fn bt(&self) -> usize {
        self.b * self.t
    }

    /// Piece lengths of a block's internal activations (a full region without `res3`),
    /// in the order of the module doc.
    pub fn block_sizes(&self) -> [usize; 12] {
        let (bt, c) = (self.bt(), self.c);
        let att = self.b * self.h * self.t * self.t;
        [
            bt * c,
            bt,
            bt,
            3 * bt * c,
            bt * c,
            att,
            bt * c,
            bt * c,
            bt,
            bt,
            4 * bt * c,
            4 * bt * c,
        ]
    }

    /// Elements of a block's internal activations (what checkpointing drops per block).
    pub fn internal_len(&self) -> usize {
        self.block_sizes().iter().sum()
    }

    /// Whether block `i` is checkpointed (keeps only its output).
    pub fn checkpointed(&self, i: usize) -> bool {
        Checkpointing(self.every).keeps_output_only(i)
    }

    /// Piece lengths of the head region.
    pub fn head_sizes(&self) -> [usize; 5] {
        let bt = self.bt();
        [bt * self.c, bt, bt, bt * self.v, bt]
    }

    /// Piece lengths of the gradient scratch.
    pub fn scratch_sizes(&self) -> [usize; 6] {
        let (bt, c) = (self.bt(), self.c);
        [
            bt * c,
            bt * c,
            3 * bt * c,
            bt * c,
            4 * bt * c,
            self.t * self.t,
        ]
    }

    /// Elements of the embed region.
    pub fn embed_len(&self) -> usize {
        self.bt() * self.c
    }

    /// Elements of one full block region: the internals and `res3`.
    pub fn block_len(&self) -> usize {
        self.internal_len() + self.bt() * self.c
    }

    /// Where forward layer `layer` (0 = embed, 1..=L blocks, L+1 head) starts.
    pub fn layer_start(&self, layer: usize) -> usize {
        if layer == 0 {
            0
        } else {
            let n = (layer - 1).min(self.l);
            let blocks =
                Checkpointing(self.every).blocks_len(n, self.bt() * self.c, self.internal_len());
            self.embed_len() + blocks
        }
    }

    /// Elements of forward layer `layer`'s region.
    pub fn layer_len(&self, layer: usize) -> usize {
        match layer {
            0 => self.embed_len(),
            x if x <= self.l && self.checkpointed(x - 1) => self.bt() * self.c,
            x if x <= self.l => self.block_len(),
            _ => self.head_sizes().iter().sum(),
        }
    }

    /// Where the recompute region of checkpointed blocks starts (after the head).
    pub fn recompute_start(&self) -> usize {
        self.layer_start(self.l + 1) + self.layer_len(self.l + 1)
    }

    /// Elements of the recompute region: one block's internals, or none without
    /// checkpointing.
    pub fn recompute_len(&self) -> usize {
        Checkpointing(self.every).recompute_len(self.internal_len())
    }

    /// Where the gradient scratch starts.
    pub fn scratch_start(&self) -> usize {
        self.recompute_start() + self.recompute_len()
    }

    /// Elements of the whole arena.
    pub fn total(&self) -> usize {
        self.scratch_start() + self.scratch_sizes().iter().sum::<usize>()
    }
}

/// Activation checkpointing every k blocks (0: off), the arithmetic both families' arenas
/// share (this module's and `crate::llama::layout`'s): blocks 0, k, 2k, ... keep only their
/// output, and one block's internals are kept for the recompute.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checkpointing(pub usize);

impl Checkpointing {
    /// Whether block `i` keeps only its output.
    pub fn keeps_output_only(self, i: usize) -> bool {
        self.0 > 0 && i.is_multiple_of(self.0)
    }

    /// Elements of blocks `0..n` whose output is `out_len` and internals `internal_len`.
    pub fn blocks_len(self, n: usize, out_len: usize, internal_len: usize) -> usize {
        let checkpointed = if self.0 == 0 { 0 } else { n.div_ceil(self.0) };
        n * (internal_len + out_len) - checkpointed * internal_len
    }

    /// Elements of the recompute region: one block's internals, or none when off.
    pub fn recompute_len(self, internal_len: usize) -> usize {
        if self.0 == 0 {
            0
        } else {
            internal_len
        }
    }
}

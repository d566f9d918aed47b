//! The Llama activation arena: one buffer, sized up front for the largest micro-batch
//! (the same scheme as GPT-2's, `crate::layout`), Ckv = Hkv C/H, F the MLP width:
//!
//! ```text
//! [embed: x0 BTC][block 0 ...][block L-1 ...][head ...][recompute ...][scratch ...]
//! block: an BTC | an_rstd BT | q BTC | k BTCkv | v BTCkv | qkv 3BTC | atty BTC | att BHTT
//!        | res2 BTC | fn BTC | fn_rstd BT | h1 BTF | h3 BTF | g BTF | res3 BTC
//! checkpointed block: res3 BTC
//! head:  norm BTC | norm_rstd BT | probs BTV | losses BT
//! recompute: a block's pieces before res3 (only when some block is checkpointed)
//! scratch: dres BTC | dln BTC | dqkv 3BTC | datty BTC | dq BTC | dk BTCkv | dv BTCkv
//!          | dh1 BTF | dh3 BTF | dg BTF | dp TT
//! ```
//!
//! Each block's output (`res3`) ends its region, so block i's input is the tail of
//! everything before it.
//!
//! Activation checkpointing (`LlamaConfig::checkpoint_every` = k > 0), as GPT-2's
//! (`crate::layout`): blocks 0, k, 2k, ... keep only `res3`; their internals (the
//! fourteen pieces before it) live in one `recompute` region between the head and the
//! scratch, written by the block's forward and rewritten from the saved input by its
//! backward (`super::block::block_internals`).

use crate::layout::Checkpointing;

/// Dimensions of one micro-batch's activations, and the shape constants the ops need.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaDims {
    /// B.
    pub b: usize,
    /// T.
    pub t: usize,
    /// C.
    pub c: usize,
    /// H.
    pub h: usize,
    /// Hkv.
    pub kv_h: usize,
    /// Ckv = Hkv C/H.
    pub kv: usize,
    /// F.
    pub f: usize,
    /// V.
    pub v: usize,
    /// L.
    pub l: usize,
    /// The rotary base.
    pub theta: f64,
    /// RMSNorm's epsilon.
    pub eps: f64,
    /// Checkpoint every k-th block (blocks 0, k, 2k, ...); 0: none.
    pub every: usize,
}

impl LlamaDims {
    /// B*T.
    pub fn bt(&self) -> usize {
        self.b * self.t
    }

    /// Piece lengths of a block's internals: the region of the module doc without its
    /// output `res3`.
    pub fn internal_sizes(&self) -> [usize; 14] {
        let (bt, c, kv, f) = (self.bt(), self.c, self.kv, self.f);
        let att = self.b * self.h * self.t * self.t;
        [
            bt * c,
            bt,
            bt * c,
            bt * kv,
            bt * kv,
            3 * bt * c,
            bt * c,
            att,
            bt * c,
            bt * c,
            bt,
            bt * f,
            bt * f,
            bt * f,
        ]
    }

    /// Elements of a block's internals (what checkpointing drops per block).
    pub fn internal_len(&self) -> usize {
        self.internal_sizes().iter().sum()
    }

    /// Whether block `i` is checkpointed (keeps only its output).
    pub fn checkpointed(&self, i: usize) -> bool {
        Checkpointing(self.every).keeps_output_only(i)
    }

    /// Piece lengths of the head region.
    pub fn head_sizes(&self) -> [usize; 4] {
        let bt = self.bt();
        [bt * self.c, bt, bt * self.v, bt]
    }

    /// Piece lengths of the gradient scratch.
    pub fn scratch_sizes(&self) -> [usize; 11] {
        let (bt, c, kv, f) = (self.bt(), self.c, self.kv, self.f);
        [
            bt * c,
            bt * c,
            3 * bt * c,
            bt * c,
            bt * c,
            bt * kv,
            bt * kv,
            bt * f,
            bt * f,
            bt * f,
            self.t * self.t,
        ]
    }

    /// Elements of one full block region: the internals and `res3`.
    pub fn block_len(&self) -> usize {
        self.internal_len() + self.bt() * self.c
    }

    /// Where region `r` (0 = embed, 1..=L blocks, L+1 head) starts.
    pub fn region_start(&self, r: usize) -> usize {
        if r == 0 {
            0
        } else {
            let n = (r - 1).min(self.l);
            let out = self.bt() * self.c;
            out + Checkpointing(self.every).blocks_len(n, out, self.internal_len())
        }
    }

    /// Elements of region `r`.
    pub fn region_len(&self, r: usize) -> usize {
        match r {
            0 => self.bt() * self.c,
            x if x <= self.l && self.checkpointed(x - 1) => self.bt() * self.c,
            x if x <= self.l => self.block_len(),
            _ => self.head_sizes().iter().sum(),
        }
    }

    /// Where the recompute region of checkpointed blocks starts (after the head).
    pub fn recompute_start(&self) -> usize {
        self.region_start(self.l + 1) + self.region_len(self.l + 1)
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

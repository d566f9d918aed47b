//! The Llama activation arena: one buffer, sized up front for the largest micro-batch
//! (the same scheme as GPT-2's, `crate::layout`), Ckv = Hkv C/H, F the MLP width:
//!
//! ```text
//! [embed: x0 BTC][block 0 ...][block L-1 ...][head ...][scratch ...]
//! block: an BTC | an_rstd BT | q BTC | k BTCkv | v BTCkv | qkv 3BTC | atty BTC | att BHTT
//!        | res2 BTC | fn BTC | fn_rstd BT | h1 BTF | h3 BTF | g BTF | res3 BTC
//! head:  norm BTC | norm_rstd BT | probs BTV | losses BT
//! scratch: dres BTC | dln BTC | dqkv 3BTC | datty BTC | dq BTC | dk BTCkv | dv BTCkv
//!          | dh1 BTF | dh3 BTF | dg BTF | dp TT
//! ```
//!
//! Each block's output (`res3`) ends its region, so block i's input is the tail of
//! everything before it.

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
}

impl LlamaDims {
    /// B*T.
    pub fn bt(&self) -> usize {
        self.b * self.t
    }

    /// Piece lengths of a block region, in the order of the module doc.
    pub fn block_sizes(&self) -> [usize; 15] {
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
            bt * c,
        ]
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

    /// Elements of one block region.
    pub fn block_len(&self) -> usize {
        self.block_sizes().iter().sum()
    }

    /// Where region `r` (0 = embed, 1..=L blocks, L+1 head) starts.
    pub fn region_start(&self, r: usize) -> usize {
        if r == 0 {
            0
        } else {
            self.bt() * self.c + (r - 1).min(self.l) * self.block_len()
        }
    }

    /// Elements of region `r`.
    pub fn region_len(&self, r: usize) -> usize {
        match r {
            0 => self.bt() * self.c,
            x if x <= self.l => self.block_len(),
            _ => self.head_sizes().iter().sum(),
        }
    }

    /// Where the gradient scratch starts.
    pub fn scratch_start(&self) -> usize {
        self.region_start(self.l + 1) + self.region_len(self.l + 1)
    }

    /// Elements of the whole arena.
    pub fn total(&self) -> usize {
        self.scratch_start() + self.scratch_sizes().iter().sum::<usize>()
    }
}

//! The activation arena: one buffer, sized up front for the largest micro-batch, holding
//! every activation the backward needs plus the gradient scratch of one layer:
//!
//! ```text
//! [embed: x0 BTC][block 0 ...][block L-1 ...][head ...][scratch ...]
//! block: ln1 BTC | ln1_mean BT | ln1_rstd BT | qkv 3BTC | atty BTC | att BHTT | res2 BTC
//!        | ln2 BTC | ln2_mean BT | ln2_rstd BT | fch 4BTC | fcg 4BTC | res3 BTC
//! head:  lnf BTC | lnf_mean BT | lnf_rstd BT | probs BTV | losses BT
//! scratch: dres BTC | dln BTC | dqkv 3BTC | datty BTC | dfch 4BTC | dp TT
//! ```
//!
//! Each block's output (`res3`) is the last thing in its region, so the input of block i
//! is the tail of everything before it: a layer's call views the regions before it to
//! read and its own to write (one device buffer, split into disjoint views). Every region grows with B and T, so a smaller batch
//! fits the arena laid out for a larger one.

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
}

impl Dims {
    /// B*T.
    pub fn bt(&self) -> usize {
        self.b * self.t
    }

    /// Piece lengths of a block region, in the order of the module doc.
    pub fn block_sizes(&self) -> [usize; 13] {
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
            bt * c,
        ]
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

    /// Elements of one block region.
    pub fn block_len(&self) -> usize {
        self.block_sizes().iter().sum()
    }

    /// Where forward layer `layer` (0 = embed, 1..=L blocks, L+1 head) starts.
    pub fn layer_start(&self, layer: usize) -> usize {
        if layer == 0 {
            0
        } else {
            self.embed_len() + (layer - 1).min(self.l) * self.block_len()
        }
    }

    /// Elements of forward layer `layer`'s region.
    pub fn layer_len(&self, layer: usize) -> usize {
        match layer {
            0 => self.embed_len(),
            x if x <= self.l => self.block_len(),
            _ => self.head_sizes().iter().sum(),
        }
    }

    /// Where the gradient scratch starts.
    pub fn scratch_start(&self) -> usize {
        self.layer_start(self.l + 1) + self.layer_len(self.l + 1)
    }

    /// Elements of the whole arena.
    pub fn total(&self) -> usize {
        self.scratch_start() + self.scratch_sizes().iter().sum::<usize>()
    }
}

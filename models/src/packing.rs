//! Packed rows: several documents laid end to end in each row of a batch, as
//! transformers' padding-free packing (`DataCollatorWithFlattening`) trains them. Each
//! document's positions restart at 0 and its tokens attend only to earlier tokens of the
//! same document, so a packed row computes exactly what its documents would alone.

/// Which document each token of a `[batch, seq]` batch belongs to.
///
/// A document is a maximal run of equal ids along a row; ids need not be distinct across
/// rows. Positions restart at 0 wherever the id changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Documents {
    ids: Vec<i32>,
    batch: usize,
    seq: usize,
}

impl Documents {
    /// `ids`: `[batch, seq]` row-major, one document id per token.
    ///
    /// # Panics
    /// When `ids` does not hold `batch · seq` values, naming both.
    pub fn new(ids: Vec<i32>, [batch, seq]: [usize; 2]) -> Self {
        assert_eq!(
            ids.len(),
            batch * seq,
            "Documents: {} ids for a [batch {batch}, seq {seq}] batch",
            ids.len()
        );
        Documents { ids, batch, seq }
    }

    /// `[batch, seq]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.batch, self.seq]
    }

    /// The ids, `[batch, seq]` row-major.
    pub fn ids(&self) -> &[i32] {
        &self.ids
    }

    /// Each token's position within its document, `[batch, seq]` row-major: 0 at each
    /// document's first token.
    pub fn positions(&self) -> Vec<usize> {
        let mut positions = Vec::with_capacity(self.ids.len());
        for row in self.ids.chunks(self.seq.max(1)) {
            let mut pos = 0;
            for (t, id) in row.iter().enumerate() {
                if t > 0 && *id != row[t - 1] {
                    pos = 0;
                }
                positions.push(pos);
                pos += 1;
            }
        }
        positions
    }

    /// Whether query `i` may not see key `j` of row `b`: another document, a later key,
    /// or a key outside `window` positions.
    pub fn masked(&self, b: usize, i: usize, j: usize, window: Option<usize>) -> bool {
        let row = &self.ids[b * self.seq..(b + 1) * self.seq];
        j > i || row[i] != row[j] || window.is_some_and(|w| i >= j + w)
    }
}

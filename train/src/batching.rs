//! From examples to micro-batches: a seeded shuffle per epoch, then padding or packing.
//!
//! - **Padding**: one example per row, right-padded (labels -100) to the longest example
//!   of the micro-batch rounded up to a multiple of [`PAD_MULTIPLE`] (at most
//!   `max_length`), so the number of distinct shapes, and thus of kernel compilations on
//!   CubeCL devices, stays small.
//! - **Packing**: whole examples laid end to end in rows of exactly `max_length` tokens
//!   (greedy, in shuffled order; an example that does not fit starts the next row; no
//!   example is split), the rest of a row padded. The first label of every example is
//!   -100, so no token is trained on a prediction made across an example boundary. The
//!   attention is not masked between examples of a row (the models take no attention
//!   mask), as in transformers' packing without position ids.
//!
//! Padding is always on the right: the attention is causal, so padding never changes the
//! real positions.
//!
//! The order is a function of `(seed, epoch)` only ([`shuffled_order`]), so a resumed run
//! sees the same micro-batches as an uninterrupted one.

// The order must never depend on a library's version: a fully specified generator.
use crate::prompt::Tokenized;
use crate::rng::SplitMix64;
use liger_models::IGNORE_INDEX;

/// Padded sequence lengths are multiples of this (or `max_length`).
pub const PAD_MULTIPLE: usize = 8;

/// Padding or packing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// One example per row.
    Pad,
    /// Several whole examples per row of `max_length`, each attending only to itself
    /// with positions restarting at 0 (transformers' padding-free packing).
    Pack,
}

/// A micro-batch on the host, row-major `[batch, seq]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, `[batch, seq]` row-major (pad id at padded positions).
    pub input_ids: Vec<i64>,
    /// Labels, `[batch, seq]` row-major: -100 on prompts, padding and each example's
    /// first token.
    pub labels: Vec<i64>,
    /// Rows.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Real (non-padding) tokens.
    pub tokens: usize,
    /// Labels other than -100: the tokens the loss is the mean over.
    pub trained: usize,
    /// Indices (into the dataset's examples) of the examples of each row, in order.
    pub rows: Vec<Vec<usize>>,
    /// When packing: the example each token belongs to, `[batch, seq]` row-major (its
    /// index within the row; the padding after the last example is one more), so that
    /// examples attend only to themselves and their positions restart at 0.
    pub documents: Option<Vec<i32>>,
}

impl Batch {
    /// `[batch, seq]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.batch, self.seq]
    }
}

/// The example order of `epoch`: a Fisher-Yates shuffle of `0..n` seeded by `(seed, epoch)`.
pub fn shuffled_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed ^ (epoch as u64).wrapping_mul(0xd1b5_4a32_d192_ed03));
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    order
}

/// Rows of examples in `order`: one per row when padding; greedy packing into
/// `max_length` when packing. Every example must be at most `max_length` long.
pub fn assign_rows(
    examples: &[Tokenized],
    order: &[usize],
    layout: Layout,
    max_length: usize,
) -> Vec<Vec<usize>> {
    match layout {
        Layout::Pad => order.iter().map(|&i| vec![i]).collect(),
        Layout::Pack => {
            let mut rows = Vec::new();
            let mut row = Vec::new();
            let mut used = 0;
            for &i in order {
                let len = examples[i].len();
                assert!(
                    len <= max_length,
                    "example of line {} is {len} tokens, longer than max_length {max_length}",
                    examples[i].line
                );
                if used + len > max_length {
                    rows.push(std::mem::take(&mut row));
                    used = 0;
                }
                row.push(i);
                used += len;
            }
            if !row.is_empty() {
                rows.push(row);
            }
            rows
        }
    }
}

/// Builds the micro-batch of `rows` (each a list of example indices laid end to end).
///
/// Returns `[rows.len(), seq]` tensors as host vectors, where `seq` is `max_length` when
/// packing and the longest row rounded up to [`PAD_MULTIPLE`] (at most `max_length`,
/// at least 2) when padding.
pub fn make_batch(
    examples: &[Tokenized],
    rows: &[Vec<usize>],
    layout: Layout,
    max_length: usize,
    pad_id: u32,
) -> Batch {
    let longest = rows
        .iter()
        .map(|r| r.iter().map(|&i| examples[i].len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let seq = match layout {
        Layout::Pack => max_length,
        Layout::Pad => longest.div_ceil(PAD_MULTIPLE) * PAD_MULTIPLE,
    }
    .min(max_length)
    .max(longest)
    .max(2);
    let batch = rows.len();
    let mut input_ids = vec![pad_id as i64; batch * seq];
    let mut labels = vec![IGNORE_INDEX; batch * seq];
    let (mut tokens, mut trained) = (0, 0);
    let mut documents = vec![0i32; batch * seq];
    for (b, row) in rows.iter().enumerate() {
        let mut t = b * seq;
        documents[t..(b + 1) * seq].fill(row.len() as i32);
        for (doc, &i) in row.iter().enumerate() {
            let ex = &examples[i];
            for (k, (&id, &label)) in ex.input_ids.iter().zip(&ex.labels).enumerate() {
                input_ids[t] = id as i64;
                documents[t] = doc as i32;
                // The first token of an example is never trained (see the module doc).
                labels[t] = if k == 0 { IGNORE_INDEX } else { label };
                trained += (labels[t] != IGNORE_INDEX) as usize;
                t += 1;
            }
            tokens += ex.len();
        }
    }
    Batch {
        input_ids,
        labels,
        batch,
        seq,
        tokens,
        trained,
        rows: rows.to_vec(),
        documents: (layout == Layout::Pack).then_some(documents),
    }
}

/// The micro-batches of one epoch: shuffled, laid out, `batch_size` rows each (the last
/// one may have fewer rows: no example is dropped).
pub fn epoch_batches(
    examples: &[Tokenized],
    seed: u64,
    epoch: usize,
    layout: Layout,
    batch_size: usize,
    max_length: usize,
    pad_id: u32,
) -> Vec<Batch> {
    assert!(batch_size > 0, "batch_size must be positive");
    let order = shuffled_order(examples.len(), seed, epoch);
    let rows = assign_rows(examples, &order, layout, max_length);
    rows.chunks(batch_size)
        .map(|chunk| make_batch(examples, chunk, layout, max_length, pad_id))
        .collect()
}

/// The micro-batches of one epoch of preference pairs (`examples[2i]` chosen,
/// `examples[2i + 1]` rejected): the pairs shuffled, `batch_size` pairs per micro-batch
/// (the last may have fewer), each padded as one batch of `2 · pairs` rows: the chosen
/// sequences, then the rejected ones in the same order (the layout of the preference
/// losses).
pub fn epoch_pair_batches(
    examples: &[Tokenized],
    seed: u64,
    epoch: usize,
    batch_size: usize,
    max_length: usize,
    pad_id: u32,
) -> Vec<Batch> {
    assert!(batch_size > 0, "batch_size must be positive");
    assert!(
        examples.len().is_multiple_of(2),
        "pairs hold an even number of sequences"
    );
    let order = shuffled_order(examples.len() / 2, seed, epoch);
    order
        .chunks(batch_size)
        .map(|pairs| {
            let rows: Vec<Vec<usize>> = pairs
                .iter()
                .map(|&p| vec![2 * p])
                .chain(pairs.iter().map(|&p| vec![2 * p + 1]))
                .collect();
            make_batch(examples, &rows, Layout::Pad, max_length, pad_id)
        })
        .collect()
}

/// Position in the stream of micro-batches: epoch and micro-batch index within it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    /// 0-based epoch.
    pub epoch: usize,
    /// Index of the next micro-batch in that epoch.
    pub batch: usize,
}

/// The endless stream of micro-batches, epoch after epoch, resumable at a [`Cursor`].
pub struct BatchStream<'a> {
    examples: &'a [Tokenized],
    seed: u64,
    layout: Layout,
    batch_size: usize,
    max_length: usize,
    pad_id: u32,
    cursor: Cursor,
    current: Vec<Batch>,
    paired: bool,
}

impl<'a> BatchStream<'a> {
    /// A stream starting at `cursor`.
    pub fn new(
        examples: &'a [Tokenized],
        seed: u64,
        layout: Layout,
        batch_size: usize,
        max_length: usize,
        pad_id: u32,
        cursor: Cursor,
    ) -> Self {
        let mut s = BatchStream {
            examples,
            seed,
            layout,
            batch_size,
            max_length,
            pad_id,
            cursor,
            current: Vec::new(),
            paired: false,
        };
        s.load_epoch();
        s
    }

    /// The same stream over preference pairs ([`epoch_pair_batches`]): `batch_size` pairs
    /// per micro-batch.
    pub fn paired(mut self) -> Self {
        self.paired = true;
        self.load_epoch();
        self
    }

    fn load_epoch(&mut self) {
        if self.paired {
            self.current = epoch_pair_batches(
                self.examples,
                self.seed,
                self.cursor.epoch,
                self.batch_size,
                self.max_length,
                self.pad_id,
            );
            return;
        }
        self.current = epoch_batches(
            self.examples,
            self.seed,
            self.cursor.epoch,
            self.layout,
            self.batch_size,
            self.max_length,
            self.pad_id,
        );
    }

    /// Where the next micro-batch comes from.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// Micro-batches in the current epoch.
    pub fn batches_in_epoch(&self) -> usize {
        self.current.len()
    }

    /// The next micro-batch (moving to the next epoch when this one is done).
    pub fn next_batch(&mut self) -> Batch {
        if self.cursor.batch >= self.current.len() {
            self.cursor = Cursor {
                epoch: self.cursor.epoch + 1,
                batch: 0,
            };
            self.load_epoch();
        }
        let b = self.current[self.cursor.batch].clone();
        self.cursor.batch += 1;
        b
    }
}

//! `ByteWindows`, a byte text cut into token windows for a language model.

use std::sync::Arc;

use flodl_tensor::DType;

use crate::batch::HostBatch;
use crate::dataset::{Dataset, check_indices};
use crate::error::{Error, Result};
use crate::layout::{Field, SampleLayout};

/// A byte text as a dataset of windows of `context + 1` tokens (a byte each, as i32 in
/// `0..256`): the model reads tokens `0..context` of a window and predicts tokens `1..=context`.
///
/// Window `i` starts at byte `i × context`, so consecutive windows share one byte and every byte
/// after the first is a prediction target of exactly one window: an epoch that visits every
/// sample once predicts every byte of the text once (the tail shorter than a window is left
/// out). Layout: field 0 `tokens`, i32 `[context + 1]`.
#[derive(Debug, Clone)]
pub struct ByteWindows {
    bytes: Arc<[u8]>,
    context: usize,
    len: usize,
    layout: SampleLayout,
}

impl ByteWindows {
    /// Index of the token field.
    pub const TOKENS: usize = 0;

    /// Size of the vocabulary: one token per byte value.
    pub const VOCAB: usize = 256;

    /// The windows of `context + 1` bytes of `bytes`, at stride `context`.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when `context` is 0; [`Error::TextTooShort`] when `bytes` holds
    /// fewer than `context + 1` bytes (not one window).
    pub fn new(bytes: impl Into<Arc<[u8]>>, context: usize) -> Result<Self> {
        let bytes = bytes.into();
        if context == 0 {
            return Err(Error::InvalidLayout {
                reason: "a token window needs a context of at least one byte".into(),
            });
        }
        let len = bytes.len().saturating_sub(1) / context;
        if len == 0 {
            return Err(Error::TextTooShort { bytes: bytes.len(), window: context + 1 });
        }
        Ok(Self { bytes, context, len, layout: Self::layout_for(context) })
    }

    /// The layout of a window of `context + 1` tokens.
    pub fn layout_for(context: usize) -> SampleLayout {
        // One i32 field of at least one element: a valid layout.
        SampleLayout::trusted(vec![Field::new("tokens", &[context + 1], DType::I32)])
    }

    /// Tokens the model reads per window (the window holds one more).
    pub fn context(&self) -> usize {
        self.context
    }

    /// The whole text.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes of window `i`, or `None` past the last window.
    pub fn window(&self, i: usize) -> Option<&[u8]> {
        (i < self.len).then(|| &self.bytes[i * self.context..i * self.context + self.context + 1])
    }
}

impl Dataset for ByteWindows {
    fn len(&self) -> usize {
        self.len
    }

    fn layout(&self) -> &SampleLayout {
        &self.layout
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        check_indices(indices, self.len)?;
        out.prepare(&self.layout, indices.len())?;
        let k = self.context + 1;
        let dst = out.i32_mut(Self::TOKENS)?;
        for (row, &i) in dst.chunks_exact_mut(k).zip(indices) {
            let src = &self.bytes[i * self.context..i * self.context + k];
            for (d, &s) in row.iter_mut().zip(src) {
                *d = i32::from(s);
            }
        }
        Ok(())
    }
}

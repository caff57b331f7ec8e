// A custom replica trained by the `Trainer`: softmax regression on MNIST, written only against
// the public API of flodl-ddp, flodl-data and flodl-tensor (not the reference MLP).
//
//     cargo run --release -p flodl-ddp --example softmax [-- TRAIN_SAMPLES]
//
// The batch layout rules the replica relies on: the batch's fields come in the order of the
// dataset's `SampleLayout` (MNIST: `image`, then `label`), each with its field's dtype (the image
// f32, the label i32); a field whose samples are scalars arrives as `[n]` (the labels), any other
// as `[n, features]` (the images as `[n, 784]`, the sample's dimensions flattened). Training
// batches always hold `ReplicaContext::batch_size` samples; evaluation batches may be shorter.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{
    Backend, Batch, BatchEval, Devices, Error, Policy, Replica, ReplicaContext, Result, Trainer,
};
use flodl_tensor::ops::{self, Transpose};
use flodl_tensor::{DType, Stream, Tensor};

/// MNIST's pixels per image and classes.
const FEATURES: usize = 784;
const CLASSES: usize = 10;

/// Logits and their gradient for batches of one size.
struct Scratch {
    logits: Tensor,
    dlogits: Tensor,
}

impl Scratch {
    fn new(n: usize, stream: &Stream) -> Result<Scratch> {
        Ok(Scratch {
            logits: Tensor::zeros(&[n, CLASSES], DType::F32, stream)?,
            dlogits: Tensor::zeros(&[n, CLASSES], DType::F32, stream)?,
        })
    }
}

/// Softmax regression, `logits = x·W + b`, trained by plain SGD.
pub(crate) struct SoftmaxRegression {
    stream: Stream,
    /// `W` (`[784, 10]`) and `b` (`[10]`), zero at the start on every rank.
    params: Vec<Tensor>,
    /// Their gradients, same order and shapes (exposed: gradient clipping can scale them).
    grads: Vec<Tensor>,
    train: Scratch,
    /// Evaluation batches of another size (the last one of a test set).
    eval: Option<(usize, Scratch)>,
}

impl SoftmaxRegression {
    /// The replica for the rank described by `ctx`: every tensor on its stream.
    pub(crate) fn new(ctx: &ReplicaContext) -> Result<SoftmaxRegression> {
        let s = &ctx.stream;
        let shapes: [&[usize]; 2] = [&[FEATURES, CLASSES], &[CLASSES]];
        let zeros = || -> Result<Vec<Tensor>> {
            shapes.iter().map(|sh| Ok(Tensor::zeros(sh, DType::F32, s)?)).collect()
        };
        Ok(SoftmaxRegression {
            stream: s.clone(),
            params: zeros()?,
            grads: zeros()?,
            train: Scratch::new(ctx.batch_size, s)?,
            eval: None,
        })
    }

    /// The batch's images (`[n, 784]` f32) and labels (`[n]` i32), in MNIST's layout order.
    fn inputs(batch: &Batch) -> Result<(&Tensor, &Tensor)> {
        let (x, y) = (batch.field(0)?, batch.field(1)?);
        let n = batch.len();
        if x.shape() != [n, FEATURES] || x.dtype() != DType::F32 {
            let found = format!("{:?} {:?}", x.dtype(), x.shape());
            return Err(Error::mismatch("images", format!("F32 [{n}, {FEATURES}]"), found));
        }
        if y.shape() != [n] || y.dtype() != DType::I32 {
            let found = format!("{:?} {:?}", y.dtype(), y.shape());
            return Err(Error::mismatch("labels", format!("I32 [{n}]"), found));
        }
        Ok((x, y))
    }

    /// `logits = x·W + b`.
    fn forward(params: &[Tensor], x: &Tensor, logits: &mut Tensor, s: &Stream) -> Result<()> {
        ops::gemm(1.0, x, Transpose::No, &params[0], Transpose::No, 0.0, logits, s)?;
        ops::bias_add(logits, &params[1], s)?;
        Ok(())
    }
}

impl Replica for SoftmaxRegression {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        let (x, y) = Self::inputs(batch)?;
        let (s, t) = (&self.stream, &mut self.train);
        Self::forward(&self.params, x, &mut t.logits, s)?;
        // Mean cross-entropy; `dlogits` is its gradient, (softmax − onehot) / n.
        let loss = ops::log_softmax_nll(&t.logits, y, &mut t.dlogits, s)?;
        ops::gemm(1.0, x, Transpose::Yes, &t.dlogits, Transpose::No, 0.0, &mut self.grads[0], s)?;
        ops::sum_rows(&t.dlogits, &mut self.grads[1], s)?;
        Ok(loss)
    }

    fn step(&mut self, lr: f32) -> Result<()> {
        for (p, g) in self.params.iter_mut().zip(&self.grads) {
            ops::axpy(-lr, g, p, &self.stream)?;
        }
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
        Some(&mut self.grads)
    }

    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        let (x, y) = Self::inputs(batch)?;
        let n = batch.len();
        let s = &self.stream;
        let scratch = if n == self.train.logits.shape()[0] {
            &mut self.train
        } else {
            if self.eval.as_ref().map(|(m, _)| *m) != Some(n) {
                self.eval = Some((n, Scratch::new(n, s)?));
            }
            match self.eval.as_mut() {
                Some((_, scratch)) => scratch,
                None => return Ok(None),
            }
        };
        Self::forward(&self.params, x, &mut scratch.logits, s)?;
        let loss = ops::log_softmax_nll(&scratch.logits, y, &mut scratch.dlogits, s)?;
        let correct = ops::argmax_correct(&scratch.logits, y, s)?;
        Ok(Some(BatchEval { loss_sum: f64::from(loss) * n as f64, correct, samples: n }))
    }
}

/// Trains softmax regression on the first `train_samples` MNIST training images with 2 CPU
/// ranks under `policy`, then evaluates the returned model on the first `test_samples` test
/// images with `flodl_ddp::evaluate`: returns the test accuracy.
pub(crate) fn train(
    train_samples: usize,
    test_samples: usize,
    epochs: usize,
    policy: Policy,
) -> std::result::Result<f64, Box<dyn StdError>> {
    let dir = flodl_data::mnist::vendored_dir();
    let mnist = |split| -> std::result::Result<Arc<Mnist>, flodl_data::Error> {
        Ok(Arc::new(Mnist::load(&dir, split, Verify::Skip)?))
    };
    let train: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Train)?, train_samples));
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test)?, test_samples));
    let mut run = Trainer::new(SoftmaxRegression::new)
        .dataset(train)
        .test_dataset(test.clone(), 1)
        .batch_size(32)
        .epochs(epochs)
        .devices(Devices::Cpu(2))
        .policy(policy)
        .backend(Backend::Collective)
        .learning_rate(0.5)
        .run()?;
    while let Some(epoch) = run.next_metrics(Duration::from_secs(600)) {
        let eval = epoch.eval.map(|e| format!("  test accuracy {:.2}%", 100.0 * e.accuracy));
        println!("epoch {}  loss {:.4}{}", epoch.epoch, epoch.avg_loss, eval.unwrap_or_default());
    }
    let state = run.join()?;
    // The averaged model, loaded into a fresh replica and evaluated on its own stream.
    let stream = Stream::cpu_with_threads(1);
    let ctx = ReplicaContext::alone(stream, 32, 0);
    let mut model = SoftmaxRegression::new(&ctx)?;
    state.load_into(&mut model, &ctx.stream)?;
    let eval = flodl_ddp::evaluate(&mut model, test.as_ref(), 256, &ctx.stream)?
        .ok_or("the replica did not evaluate")?;
    Ok(eval.accuracy)
}

fn main() -> std::result::Result<(), Box<dyn StdError>> {
    let samples = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 60_000,
    };
    let accuracy = train(samples, 10_000, 3, Policy::Cadence)?;
    println!("softmax regression: {:.2}% test accuracy", 100.0 * accuracy);
    Ok(())
}

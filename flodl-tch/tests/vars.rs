//! `Vars`, `TchReplica` and `Parameters` against libtorch's own view of the variables.

use flodl_ddp::{Batch, Parameters, Replica};
use flodl_tch::{Error, Model, TchReplica, Vars, indices, seeded, values};
use flodl_tensor::{Stream, Tensor as FTensor};
use tch::nn::{self, Module, VarStore};
use tch::{Kind, Tensor};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The values of `t`, flattened, as libtorch reads them.
fn torch_values(t: &Tensor) -> Result<Vec<f32>, tch::TchError> {
    Vec::<f32>::try_from(t.flatten(0, -1))
}

/// A store with variables created out of name order, one of them not trainable.
fn store(seed: u64) -> VarStore {
    let vs = VarStore::new(tch::Device::Cpu);
    seeded(seed, || {
        let root = vs.root();
        let _ = root.randn("zeta", &[3, 4], 0.0, 1.0);
        let _ = root.randn("alpha", &[5], 0.0, 1.0);
        let _ = (&root / "mid").randn("w", &[2, 2, 2], 0.0, 1.0);
        let _ = root.zeros_no_train("running", &[3]);
    });
    vs
}

#[test]
fn parameters_come_in_name_order_and_read_libtorchs_values() -> TestResult {
    for seed in 0..4 {
        let vs = store(seed);
        let vars = Vars::new(&vs)?;
        assert_eq!(vars.names().collect::<Vec<_>>(), ["alpha", "mid.w", "zeta"]);
        assert_eq!(vars.shapes(), vec![vec![5], vec![2, 2, 2], vec![3, 4]]);
        assert_eq!((vars.len(), vars.buffer_count(), vars.numel()), (3, 1, 25));
        let named = vs.variables();
        for (i, name) in ["alpha", "mid.w", "zeta"].iter().enumerate() {
            let want = torch_values(&named[*name])?;
            let mut got = vec![0.0; want.len()];
            vars.read(i, &mut got)?;
            assert_eq!(got, want, "seed {seed}, {name}");
            // The cooperative tier's view is the same.
            let mut through = vec![0.0; want.len()];
            Parameters::read(&vars, i, &mut through)?;
            assert_eq!(through, want);
        }
    }
    Ok(())
}

#[test]
fn writes_land_in_the_variables_storage() -> TestResult {
    let vs = store(1);
    let mut vars = Vars::new(&vs)?;
    let named = vs.variables();
    for (i, name) in ["alpha", "mid.w", "zeta"].iter().enumerate() {
        let n = named[*name].numel();
        let fresh: Vec<f32> = (0..n).map(|k| (k as f32 * 0.37 + i as f32).sin()).collect();
        Parameters::write(&mut vars, i, &fresh)?;
        assert_eq!(torch_values(&named[*name])?, fresh, "{name}");
    }
    vars.write_buffer(0, &[1.0, 2.0, 3.0])?;
    assert_eq!(torch_values(&named["running"])?, vec![1.0, 2.0, 3.0]);
    Ok(())
}

#[test]
fn misfits_are_typed_errors() -> TestResult {
    let vs = store(2);
    let mut vars = Vars::new(&vs)?;
    let before = torch_values(&vs.variables()["alpha"])?;
    assert!(matches!(vars.write(0, &[0.0; 4]), Err(Error::Size { have: 5, want: 4, .. })));
    assert!(matches!(vars.read(3, &mut [0.0; 5]), Err(Error::Index { index: 3, count: 3 })));
    assert!(matches!(vars.read_buffer(1, &mut [0.0; 3]), Err(Error::Index { .. })));
    // A failed write leaves the variable as it was.
    assert_eq!(torch_values(&vs.variables()["alpha"])?, before);
    // Into flodl's error: a size misfit is a replica mismatch.
    let e: flodl_ddp::Error = Error::Size { name: "x".into(), have: 1, want: 2 }.into();
    assert!(matches!(e, flodl_ddp::Error::ReplicaMismatch { .. }));
    Ok(())
}

#[test]
fn only_f32_host_variables_are_taken() -> TestResult {
    let mut vs = store(3);
    vs.double();
    match Vars::new(&vs) {
        Err(Error::Unsupported { what, .. }) => assert_eq!(what, "Double"),
        other => panic!("a Double store was taken: {other:?}"),
    }
    Ok(())
}

/// y = x·w + b, mean squared error.
struct Affine(nn::Linear);

impl Model for Affine {
    fn loss(&self, batch: &Batch) -> flodl_ddp::Result<Tensor> {
        let (x, y) = (values(batch, 0)?, values(batch, 1)?);
        Ok((self.0.forward(&x) - y).square().mean(Kind::Float))
    }
}

fn batch(stream: &Stream) -> Result<Batch, Box<dyn std::error::Error>> {
    let x: Vec<f32> = (0..24).map(|k| (k as f32 * 0.7).cos() * 10.0).collect();
    let y: Vec<f32> = (0..8).map(|k| k as f32 * 100.0).collect();
    Ok(Batch::new(vec![
        FTensor::from_slice(&x, &[8, 3], stream)?,
        FTensor::from_slice(&y, &[8, 1], stream)?,
    ])?)
}

fn affine(max_grad_norm: Option<f64>, stream: &Stream) -> flodl_ddp::Result<TchReplica<Affine>> {
    let vs = VarStore::new(tch::Device::Cpu);
    let linear = seeded(5, || nn::linear(vs.root() / "affine", 3, 1, Default::default()));
    TchReplica::new(vs, Affine(linear), nn::sgd(0.0, 0.0, 0.0, false), max_grad_norm, stream)
}

#[test]
fn the_replica_exports_and_imports_through_its_flodl_tensors() -> TestResult {
    let stream = Stream::cpu();
    let mut replica = affine(None, &stream)?;
    let weights = torch_values(&replica.model().0.ws)?;
    // `affine.bias` sorts before `affine.weight`.
    assert_eq!(replica.parameters()[1].as_slice::<f32>()?, weights.as_slice());
    let averaged = [0.25f32, -0.5, 0.75];
    replica.parameters_mut()[1].as_mut_slice::<f32>()?.copy_from_slice(&averaged);
    replica.import_parameters()?;
    assert_eq!(torch_values(&replica.model().0.ws)?, averaged);
    // A step moves the model; export brings the move into the flodl tensors.
    let b = batch(&stream)?;
    replica.train_step(&b)?;
    replica.step(1e-4)?;
    replica.export_parameters()?;
    let moved = torch_values(&replica.model().0.ws)?;
    assert_ne!(moved, averaged);
    assert_eq!(replica.parameters()[1].as_slice::<f32>()?, moved.as_slice());
    Ok(())
}

/// SGD's step is `-lr × gradient`, so the step's length over `lr` is the applied gradient's
/// norm: with clipping it is `max_grad_norm`, without it the (much larger) raw norm, checked in
/// f64 against libtorch's own gradient.
#[test]
fn steps_clip_the_global_gradient_norm() -> TestResult {
    let stream = Stream::cpu();
    let b = batch(&stream)?;
    for (max, lr) in [(Some(0.5), 1e-2), (Some(3.0), 1e-3), (None, 1e-6)] {
        let mut replica = affine(max, &stream)?;
        let before: Vec<f64> = (0..2)
            .flat_map(|i| replica.parameters()[i].as_slice::<f32>().map(|s| s.to_vec()))
            .flatten()
            .map(f64::from)
            .collect();
        replica.train_step(&b)?;
        let raw: f64 = [&replica.model().0.ws, replica.model().0.bs.as_ref().ok_or("no bias")?]
            .iter()
            .map(|t| t.grad().to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[]))
            .sum::<f64>()
            .sqrt();
        replica.step(lr as f32)?;
        replica.export_parameters()?;
        let after: Vec<f64> = (0..2)
            .flat_map(|i| replica.parameters()[i].as_slice::<f32>().map(|s| s.to_vec()))
            .flatten()
            .map(f64::from)
            .collect();
        let moved = before.iter().zip(&after).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
        let want = max.map_or(raw, |m| m.min(raw));
        assert!(raw > 3.0, "the raw gradient norm {raw} must exceed the clips");
        let rel = (moved / f64::from(lr as f32) - want).abs() / want;
        assert!(rel < 1e-3, "{max:?}: step {moved}, lr {lr}, want norm {want}, rel {rel}");
    }
    Ok(())
}

#[test]
fn batch_fields_become_tch_tensors() -> TestResult {
    let stream = Stream::cpu();
    let b = Batch::new(vec![FTensor::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3], &stream)?])?;
    let t = indices(&b, 0)?;
    assert_eq!((t.size(), t.kind()), (vec![2, 3], Kind::Int64));
    assert_eq!(Vec::<i64>::try_from(t.flatten(0, -1))?, vec![1, 2, 3, 4, 5, 6]);
    assert!(values(&b, 0).is_err(), "an i32 field is not f32 values");
    assert!(indices(&b, 1).is_err(), "no field 1");
    Ok(())
}

//! Layouts, host batches and the in-memory dataset: construction checks and exact gathers.

use flodl_data::{Dataset, Error, Field, HostBatch, InMemory, Result, SampleLayout, Values};
use flodl_tensor::{DType, Device, Stream, Tensor};

fn layout() -> Result<SampleLayout> {
    SampleLayout::new(vec![Field::new("x", &[2, 3], DType::F32), Field::new("y", &[], DType::I32)])
}

#[test]
fn layouts_reject_what_a_batch_cannot_hold() -> Result<()> {
    let l = layout()?;
    assert_eq!(l.sample_bytes(), 6 * 4 + 4);
    assert_eq!(l.position("y"), Some(1));
    assert_eq!(l.field(0)?.batch_shape(5), vec![5, 2, 3]);
    assert!(matches!(l.field(2), Err(Error::NoSuchField { field: 2, fields: 2 })));
    let bad = [
        vec![],
        vec![Field::new("a", &[1], DType::F32), Field::new("a", &[1], DType::I32)],
        vec![Field::new("a", &[0, 4], DType::F32)],
        vec![Field::new("a", &[4], DType::Bf16)],
    ];
    for fields in bad {
        assert!(matches!(SampleLayout::new(fields), Err(Error::InvalidLayout { .. })));
    }
    Ok(())
}

#[test]
fn gathers_match_the_source_rows_and_check_their_inputs() -> Result<()> {
    let n = 37;
    let x: Vec<f32> = (0..n * 6).map(|i| i as f32 * 0.5 - 3.0).collect();
    let y: Vec<i32> = (0..n as i32).map(|i| i * 7 - 100).collect();
    let ds = InMemory::new(layout()?, vec![Values::F32(x.clone()), Values::I32(y.clone())])?;
    assert_eq!(ds.len(), n);
    let mut out = HostBatch::new(ds.layout(), Device::Cpu);
    for indices in [vec![], vec![0], vec![36, 0, 5, 5, 17], (0..n).rev().collect::<Vec<_>>()] {
        ds.fetch(&indices, &mut out)?;
        assert_eq!(out.len(), indices.len());
        for (row, &i) in indices.iter().enumerate() {
            assert_eq!(out.f32(0)?[row * 6..(row + 1) * 6], x[i * 6..(i + 1) * 6]);
            assert_eq!(out.i32(1)?[row], y[i]);
        }
    }
    assert!(matches!(out.i32(0), Err(Error::FieldType { field: 0, .. })));
    assert!(matches!(out.f32(1), Err(Error::FieldType { field: 1, .. })));
    assert!(matches!(out.f32(2), Err(Error::NoSuchField { .. })));
    assert!(matches!(ds.fetch(&[n], &mut out), Err(Error::IndexOutOfRange { .. })));
    // A batch made for another layout is refused, not overwritten.
    let other = SampleLayout::new(vec![Field::new("x", &[6], DType::F32)])?;
    let mut wrong = HostBatch::new(&other, Device::Cpu);
    assert!(matches!(ds.fetch(&[0], &mut wrong), Err(Error::LayoutMismatch)));
    // Construction checks.
    assert!(matches!(
        InMemory::new(layout()?, vec![Values::F32(vec![0.0; 12]), Values::I32(vec![0; 3])]),
        Err(Error::FieldLength { field: 1, len: 3, expected: 2 })
    ));
    assert!(matches!(
        InMemory::new(layout()?, vec![Values::I32(vec![0; 12]), Values::I32(vec![0; 2])]),
        Err(Error::FieldType { field: 0, .. })
    ));
    assert!(InMemory::new(layout()?, vec![Values::F32(vec![0.0; 12])]).is_err());
    Ok(())
}

#[test]
fn tensors_become_a_dataset() -> Result<()> {
    let s = Stream::cpu_with_threads(1);
    let x = Tensor::rand_uniform(&[10, 4], -1.0, 1.0, 3, &s)?;
    let labels: Vec<i32> = (0..10).map(|i| i % 3).collect();
    let y = Tensor::from_slice(&labels, &[10], &s)?;
    let ds = InMemory::from_tensors(&[("x", &x), ("y", &y)], &s)?;
    assert_eq!(ds.len(), 10);
    assert_eq!(ds.layout().fields()[0].shape, vec![4]);
    assert_eq!(ds.layout().fields()[1].shape, Vec::<usize>::new());
    let mut out = HostBatch::new(ds.layout(), Device::Cpu);
    ds.fetch(&[9, 2], &mut out)?;
    let xs = x.to_vec::<f32>(&s)?;
    assert_eq!(out.f32(0)?[..4], xs[36..40]);
    assert_eq!(out.f32(0)?[4..], xs[8..12]);
    assert_eq!(out.i32(1)?, &[labels[9], labels[2]]);
    let short = Tensor::from_slice(&labels[..9], &[9], &s)?;
    assert!(matches!(
        InMemory::from_tensors(&[("x", &x), ("y", &short)], &s),
        Err(Error::FieldLength { field: 1, .. })
    ));
    let scalar = Tensor::from_slice(&[1.0f32], &[], &s)?;
    assert!(matches!(
        InMemory::from_tensors(&[("s", &scalar)], &s),
        Err(Error::InvalidLayout { .. })
    ));
    Ok(())
}

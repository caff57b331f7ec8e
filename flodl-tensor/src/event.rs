//! Events: markers recorded on a stream, for ordering and timing.

use std::sync::Mutex;
use std::time::Instant;

use crate::stream::StreamInner;
use crate::{Device, Error, Result, Stream, cuda};

/// A marker recorded on a stream: later work can wait for it, and two timed events give the
/// elapsed time between them.
///
/// [`Event::new`] makes a plain marker (on CUDA an event created with timing disabled, which is
/// cheaper to record and wait on: fences and ready events need nothing more);
/// [`Event::timed`] makes one that can also be measured with [`Event::elapsed_ms`]. On the CPU
/// an event records the instant at which it was recorded (CPU work is complete when issued).
#[derive(Debug)]
pub struct Event {
    inner: EventInner,
    timing: Timing,
}

/// Whether an event can be measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timing {
    /// Orders work only.
    Marker,
    /// Also gives elapsed time.
    Timed,
}

#[derive(Debug)]
enum EventInner {
    Cpu(Mutex<Option<Instant>>),
    Cuda(cuda::CudaEvent),
}

impl Event {
    /// A new, not yet recorded marker for `device` (no timing: [`Event::elapsed_ms`] refuses it).
    ///
    /// # Errors
    /// CUDA unavailable or a driver error for CUDA devices.
    pub fn new(device: Device) -> Result<Event> {
        Event::with_timing(device, Timing::Marker)
    }

    /// A new, not yet recorded event for `device` that [`Event::elapsed_ms`] can measure.
    ///
    /// # Errors
    /// CUDA unavailable or a driver error for CUDA devices.
    pub fn timed(device: Device) -> Result<Event> {
        Event::with_timing(device, Timing::Timed)
    }

    fn with_timing(device: Device, timing: Timing) -> Result<Event> {
        let inner = match device {
            Device::Cpu => EventInner::Cpu(Mutex::new(None)),
            Device::Cuda(ordinal) => {
                EventInner::Cuda(cuda::CudaEvent::new(ordinal, timing == Timing::Timed)?)
            }
        };
        Ok(Event { inner, timing })
    }

    /// The device this event belongs to.
    pub fn device(&self) -> Device {
        match &self.inner {
            EventInner::Cpu(_) => Device::Cpu,
            EventInner::Cuda(e) => Device::Cuda(e.ordinal()),
        }
    }

    /// Records this event at the current end of `stream`'s work.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when the stream is on another device; a driver error.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.check_device("event record", self.device())?;
        match (&self.inner, stream.inner()) {
            (EventInner::Cpu(at), _) => {
                *at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                Ok(())
            }
            (EventInner::Cuda(e), StreamInner::Cuda(s)) => e.record(s),
            (EventInner::Cuda(_), StreamInner::Cpu(_)) => Err(Error::DeviceMismatch {
                op: "event record",
                expected: Device::Cpu,
                got: self.device(),
            }),
        }
    }

    /// Blocks until the work before the recorded point has finished (immediate on the CPU).
    ///
    /// # Errors
    /// A driver error.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            EventInner::Cpu(_) => Ok(()),
            EventInner::Cuda(e) => e.synchronize(),
        }
    }

    /// Milliseconds from this event to `end` (both made by [`Event::timed`], both recorded,
    /// both on the same device).
    ///
    /// # Errors
    /// [`Error::EventNotTimed`], [`Error::EventNotRecorded`], [`Error::DeviceMismatch`], or a
    /// driver error.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        const OP: &str = "event elapsed_ms";
        if self.timing != Timing::Timed || end.timing != Timing::Timed {
            return Err(Error::EventNotTimed { op: OP });
        }
        match (&self.inner, &end.inner) {
            (EventInner::Cpu(a), EventInner::Cpu(b)) => {
                let a = *a.lock().unwrap_or_else(|p| p.into_inner());
                let b = *b.lock().unwrap_or_else(|p| p.into_inner());
                match (a, b) {
                    (Some(a), Some(b)) => {
                        let ms = if b >= a {
                            b.duration_since(a).as_secs_f64() * 1e3
                        } else {
                            -(a.duration_since(b).as_secs_f64() * 1e3)
                        };
                        Ok(ms as f32)
                    }
                    _ => Err(Error::EventNotRecorded { op: OP }),
                }
            }
            (EventInner::Cuda(a), EventInner::Cuda(b)) if a.ordinal() == b.ordinal() => {
                a.elapsed_ms(b)
            }
            _ => Err(Error::DeviceMismatch { op: OP, expected: self.device(), got: end.device() }),
        }
    }

    pub(crate) fn cuda(&self) -> Option<&cuda::CudaEvent> {
        match &self.inner {
            EventInner::Cpu(_) => None,
            EventInner::Cuda(e) => Some(e),
        }
    }
}

//! Device strings (`cpu`, `cuda`, `cuda:N`).

use crate::error::{Result, TrainError};
use tch::Device;

/// Parses `cpu`, `cuda` or `cuda:N` (errors name the value); does not check availability.
pub fn parse_device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .map(Device::Cuda)
            .ok_or_else(|| {
                TrainError::Config(format!("train.device: {s:?} is not cpu, cuda or cuda:N"))
            }),
    }
}

/// Parses and checks that the device exists on this machine.
pub fn open_device(s: &str) -> Result<Device> {
    let d = parse_device(s)?;
    if let Device::Cuda(i) = d
        && (!tch::Cuda::is_available() || i >= tch::Cuda::device_count() as usize)
    {
        return Err(TrainError::Config(format!(
            "train.device: {s} requested but {} CUDA device(s) are available (raptor info tells)",
            if tch::Cuda::is_available() {
                tch::Cuda::device_count()
            } else {
                0
            }
        )));
    }
    Ok(d)
}

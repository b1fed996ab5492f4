//! Devices (`train.device`: `cpu`, `cuda`, `cuda:N`) on libtorch.

use crate::error::{Result, RunError};
use raptor_train::config::DeviceSpec;
use tch::Device;

/// The libtorch device of a configured one (`cuda` is CUDA device 0); does not check
/// availability.
pub fn to_device(spec: DeviceSpec) -> Device {
    match spec {
        DeviceSpec::Cpu => Device::Cpu,
        DeviceSpec::Cuda(i) => Device::Cuda(i.unwrap_or(0)),
    }
}

/// Parses `cpu`, `cuda` or `cuda:N` (errors name the value); does not check availability.
pub fn parse_device(s: &str) -> Result<Device> {
    s.parse::<DeviceSpec>().map(to_device).map_err(|e| match e {
        raptor_train::config::ConfigError::Value(m) => {
            RunError::Config(format!("train.device: {m}"))
        }
        other => RunError::RunConfig(other),
    })
}

/// The libtorch device of `spec`, checked to exist on this machine.
pub fn open_device(spec: DeviceSpec) -> Result<Device> {
    let d = to_device(spec);
    if let Device::Cuda(i) = d
        && (!tch::Cuda::is_available() || i >= tch::Cuda::device_count() as usize)
    {
        return Err(RunError::Config(format!(
            "train.device: {spec} requested but {} CUDA device(s) are available (raptor info tells)",
            if tch::Cuda::is_available() {
                tch::Cuda::device_count()
            } else {
                0
            }
        )));
    }
    Ok(d)
}

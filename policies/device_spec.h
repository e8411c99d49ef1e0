// DeviceSpec: what the planner needs to know about a device: its memory, what the CUDA
// context and libraries take of it, and its rates.
//
//   DeviceSpec d = DeviceSpec::load("h100-80g");          // a preset name or a YAML file
//   std::size_t usable = d.usable_bytes();                // memory - context_bytes
//
// YAML (`device:` map; sizes take units, rates are per second with units or plain numbers):
//   device:
//     name: h100-80g
//     kind: cuda             # cpu: memfit's CPU backend; cuda: an NVIDIA GPU (required)
//     memory: 80GiB
//     context: 600MiB        # CUDA context + cuBLAS/cuDNN handles and workspaces, measured
//     flops_f32: 67e12       # dense, no tensor cores (TF32 off)
//     flops_f16: 989e12      # dense tensor-core peak
//     flops_bf16: 989e12
//     mem_bandwidth: 3.35e12 # bytes/s
//     host_link: 55e9        # bytes/s, pinned host <-> device, one direction, achieved
//     rank_link: 360e9       # bytes/s, one rank to another in one node, one direction,
//                            # achieved (NVLink, PCIe, shared memory); optional: 0, unknown
//     cpu_adamw: 1.5e9       # parameters/s of the host's CPU AdamW (offload); optional
// Presets (shipped as YAML under presets/devices/, compiled in): h200, h100-80g, a100-80g,
// a100-40g, l4-24g, rtx4090-24g, v100-32g, t4-16g, cpu (this machine class: the CPU backend's
// "device", host memory). Each preset's figures cite their source in the YAML file.
// Errors: ConfigError naming file, line, key and what is valid (unknown preset: the list).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace memfit {

// What runs the step, which decides how the dry run models GEMM workspace: the CPU backend's
// 16-bit widening scratch from the budget, or a fixed cuBLASLt workspace per GEMM.
enum class DeviceKind : std::uint8_t { kCpu, kCuda };
const char* device_kind_name(DeviceKind k);  // "cpu", "cuda"

struct DeviceSpec {
  std::string name;
  DeviceKind kind = DeviceKind::kCuda;
  std::size_t memory_bytes = 0;
  std::size_t context_bytes = 0;
  double flops_f32 = 0, flops_f16 = 0, flops_bf16 = 0;
  double mem_bandwidth = 0;  // bytes/s
  double host_link = 0;      // bytes/s
  double rank_link = 0;      // bytes/s between two ranks of one node; 0: unknown
  double cpu_adamw = 0;      // params/s; 0: unknown (the planner measures it)

  std::size_t usable_bytes() const;  // memory - context (0 if context >= memory)
  double flops(DType dt) const;

  static DeviceSpec from_yaml_string(std::string_view text, std::string_view source = "<string>");
  static DeviceSpec from_yaml_file(const std::string& path);
  static DeviceSpec preset(std::string_view name);
  static std::vector<std::string> preset_names();
  static DeviceSpec load(const std::string& name_or_path);
  std::string to_yaml() const;
};

}  // namespace memfit

#include "cli/devices_command.h"

#include <cstdio>
#include <memory>
#include <string>

#include "cli/terminal_text.h"
#include "core/model_spec.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/device_spec.h"

namespace memfit::cli {

namespace {

std::string tera(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v / 1e12);
  return buf;
}

std::string giga(double v) {
  char buf[32];
  if (v <= 0) return "-";
  std::snprintf(buf, sizeof buf, "%.0f", v / 1e9);
  return buf;
}

int run_devices(const std::string& format) {
  if (format != "table" && format != "yaml") {
    throw InvalidArgument("--format '" + format + "': valid are table, yaml");
  }
  const std::vector<std::string> names = DeviceSpec::preset_names();
  if (format == "yaml") {
    for (const std::string& n : names) say("---\n%s", DeviceSpec::preset(n).to_yaml().c_str());
    return 0;
  }
  say("%-12s %11s %11s %11s | %8s %8s %8s | %8s %8s %10s\n", "device", "memory", "context",
      "usable", "TF f32", "TF f16", "TF bf16", "mem GB/s", "link GB/s", "AdamW Gp/s");
  for (const std::string& n : names) {
    const DeviceSpec d = DeviceSpec::preset(n);
    say("%-12s %11s %11s %11s | %8s %8s %8s | %8s %8s %10s\n", n.c_str(),
        format_bytes(d.memory_bytes).c_str(), format_bytes(d.context_bytes).c_str(),
        format_bytes(d.usable_bytes()).c_str(), tera(d.flops_f32).c_str(),
        tera(d.flops_f16).c_str(), tera(d.flops_bf16).c_str(), giga(d.mem_bandwidth).c_str(),
        giga(d.host_link).c_str(), d.cpu_adamw > 0 ? giga(d.cpu_adamw).c_str() : "measured");
  }
  say("\nmodels:");
  for (const std::string& m : ModelSpec::preset_names()) {
    const ModelSpec s = ModelSpec::preset(m);
    const double n = static_cast<double>(s.parameter_count());
    if (n < 1e6) {
      say(" %s (%.0fK)", m.c_str(), n / 1e3);
    } else {
      say(" %s (%.1fM)", m.c_str(), n / 1e6);
    }
  }
  say("\nA YAML file of the same keys (--format yaml prints them) can replace a preset.\n");
  return 0;
}

}  // namespace

void add_devices_command(CLI::App& app, int& exit_code) {
  auto format = std::make_shared<std::string>("table");
  CLI::App* cmd =
      app.add_subcommand("devices", "List the device and model presets the planner knows");
  cmd->add_option("--format", *format, "table | yaml")->capture_default_str();
  cmd->callback([format, &exit_code] { exit_code = run_devices(*format); });
}

}  // namespace memfit::cli

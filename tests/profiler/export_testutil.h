// Helpers for the exporter tests: a Recording built by hand (as a Recorder would keep it, with
// consistent totals and peak), and small parsers for what the exporters write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "profiler/report.h"

namespace memfit::exporttest {

// Appends events and keeps totals, the peak and per-block live bytes the way the Recorder's
// contract describes them (profiler/recorder.h).
class RecordingBuilder {
 public:
  explicit RecordingBuilder(std::int64_t start_ns = 1'000'000);
  RecordingBuilder& segment_alloc(std::uintptr_t addr, std::size_t size);
  RecordingBuilder& segment_free(std::uintptr_t addr);
  // phase: a phase range's name ("" none); its kind is `kind` (forward by default).
  RecordingBuilder& alloc(std::uintptr_t addr, std::size_t size, Category c,
                          const std::string& phase = "", const std::string& block = "",
                          RangeKind kind = RangeKind::kForward);
  // The steps begin now (the Recorder's first step range): the step peak is tracked from the
  // state now on.
  RecordingBuilder& begin_steps();
  // Tags the next alloc() with `tag`.
  RecordingBuilder& tag(const std::string& tag) {
    tag_ = intern_name(tag);
    return *this;
  }
  RecordingBuilder& free(std::uintptr_t addr);
  RecordingBuilder& range(RangeKind kind, const std::string& name, std::int64_t begin_ns,
                          std::int64_t end_ns, std::uint64_t thread = 1, int depth = 0);
  // A pinned host region of `bytes` appears (pinned) or goes, 10 ns after the last event.
  RecordingBuilder& host(Category c, std::size_t bytes, bool pinned = true);
  RecordingBuilder& advance(std::int64_t ns) {
    now_ += ns;
    return *this;
  }
  std::int64_t now() const { return now_; }
  Recording build() const;

 private:
  struct Live {
    std::size_t size;
    Category category;
    std::uint32_t block;
  };
  void push(TimelineEvent e);
  void take(PeakInfo& p, std::int64_t t, std::uint32_t phase, std::uint32_t block) const;
  Recording rec_;
  std::int64_t now_;
  std::uint32_t tag_ = 0;
  std::map<std::uintptr_t, Live> live_;
  std::map<std::uintptr_t, std::size_t> segments_;
};

// A report around a hand-made recording: stats consistent with its peaks.
ProfileReport sample_report(const std::string& block_name = "h0");
// A run whose setup (a 4 MiB staging buffer, freed) peaks above its steps (one step, 1.5 MiB of
// activations over 1.5 MiB of parameters and optimizer state), with setup, step and phase
// ranges as RunSetup and the Trainer open them.
ProfileReport setup_spike_report();

// RFC 4180 CSV: rows of fields (quoted fields may hold separators and line breaks).
std::vector<std::vector<std::string>> parse_csv(const std::string& text);
// The index of `name` in a CSV header row (a test failure and header.size() when absent).
std::size_t column(const std::vector<std::string>& header, const std::string& name);

// Checks that every opened tag is closed in order (void elements and "/>" aside) and that no
// stray '<' starts a tag the checker cannot read; <script> only with data-memfit (the page's
// own script and data, whose content it skips to </script>). Returns "" or what is wrong.
std::string html_balance_error(const std::string& html);

std::string temp_dir(const std::string& name);  // a fresh, empty directory
bool is_root();

}  // namespace memfit::exporttest

#!/usr/bin/env bash
# Seed corpus for the fuzz harnesses, made from what memfit ships and what it writes:
#   fuzz/make_corpus.sh BUILD_DIR OUT_DIR      (BUILD_DIR holds the memfit program)
# OUT_DIR/<reader>/ gets: example configs and device presets; plans written by
# `memfit plan --out` (YAML and JSON, several policies); a memfit_viz pickle written by
# `memfit profile` and the committed PyTorch snapshot (plus protocol 0/1/2 re-pickles when
# python3 is there); a training state written by `memfit train --save` for a tiny model; text
# traces; and every committed regression input. Nothing here is committed: it is regenerated.
set -euo pipefail
build=${1:?usage: make_corpus.sh BUILD_DIR OUT_DIR}
out=${2:?usage: make_corpus.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
memfit=$build/memfit
[[ -x $memfit ]] || { echo "make_corpus.sh: $memfit not built" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

readers=(model_yaml device_yaml plan_yaml plan_json hf_config pickle alloc_trace train_state)
rm -rf "$out"
for r in "${readers[@]}"; do
  mkdir -p "$out/$r"
  if [[ -d $root/fuzz/regressions/$r ]]; then cp "$root/fuzz/regressions/$r"/* "$out/$r/" 2>/dev/null || true; fi
done

# ---- model and device YAML, HF config.json ----
cp "$root"/examples/configs/*.yaml "$out/model_yaml/"
cp "$root"/examples/configs/*.json "$out/hf_config/"
cp "$root"/presets/devices/*.yaml "$out/device_yaml/"
cat > "$work/tiny.yaml" <<'YAML'
model:
  kind: gpt
  name: fuzz-tiny
  vocab: 256
  seq_len: 8
  layers: 1
  hidden: 8
  heads: 2
  mlp_ratio: 2
YAML
cat > "$out/model_yaml/llama-flow.yaml" <<'YAML'
model: {kind: llama, name: "llama-seed", vocab: 64, seq_len: 32, layers: 2, hidden: 32, heads: 4,
  kv_heads: 2, head_dim: 8, intermediate: 64, rope_theta: 500000, qk_norm: false,
  rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4,
                 original_max_position_embeddings: 16},
  qkv_bias: true, proj_bias: false, mlp_bias: false, tied_head: false, ln_eps: 1e-6,
  attention: flash}
YAML
cp "$work/tiny.yaml" "$out/model_yaml/"

# ---- plans: what `memfit plan --out` writes ----
n=0
plan() {  # plan ARGS...: one YAML and one JSON plan
  n=$((n + 1))
  "$memfit" plan "$@" --out "$out/plan_yaml/plan$n.yaml" > /dev/null
  "$memfit" plan "$@" --out "$out/plan_json/plan$n.json" > /dev/null
}
plan --model gpt-tiny --device cpu --budget 64MiB
plan --model "$work/tiny.yaml" --device cpu --budget 6MiB
plan --model "$work/tiny.yaml" --device h100-80g --global-batch 64 --ranks 4 --zero 2
plan --model llama-micro --device cpu --budget 16MiB

# ---- pickles: memfit's memory_viz export, PyTorch's own ----
"$memfit" profile --model "$work/tiny.yaml" --steps 2 --micro-batch 2 --out "$work/report" \
  --formats pickle > /dev/null
cp "$work/report/snapshot.pickle" "$out/pickle/memfit_snapshot.pickle"
cp "$root/tests/profiler/data/torch_snapshot.pickle" "$out/pickle/"
if command -v python3 > /dev/null; then
  for proto in 0 1 2; do
    python3 -c "import pickle,sys; v=pickle.load(open(sys.argv[1],'rb')); open(sys.argv[2],'wb').write(pickle.dumps(v, protocol=$proto))" \
      "$root/tests/profiler/data/torch_snapshot.pickle" "$out/pickle/torch_snapshot_p$proto.pickle"
  done
fi

# ---- text traces ----
cat > "$out/alloc_trace/step.trace" <<'TRACE'
# a training step, as write_trace writes one
alloc 0 4194304 parameter 0 wte
alloc 1 4194304 gradient 0 wte.grad
step 1
phase forward
alloc 2 1048576 activation 0 h0.attn.qkv
alloc 3 262144 temporary 1 h0.attn.scratch
record_stream 3 0
free 3
phase backward
free 2
phase optimizer
alloc 4 8388608 optimizer_state 0 adam.m
empty_cache
step 2
free 4
TRACE
sed 's/$/\r/' "$out/alloc_trace/step.trace" > "$out/alloc_trace/step_crlf.trace"

# ---- a training state: `memfit train --save` ----
"$memfit" train --model "$work/tiny.yaml" --data "$root/data/corpus.txt" --steps 2 \
  --micro-batch 2 --save "$out/train_state/tiny.mfstate" > /dev/null

for r in "${readers[@]}"; do
  printf '%-12s %3d seeds, largest %d bytes\n' "$r" "$(ls "$out/$r" | wc -l)" \
    "$(find "$out/$r" -type f -printf '%s\n' | sort -n | tail -1)"
done

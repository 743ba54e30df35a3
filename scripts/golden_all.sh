#!/usr/bin/env bash
# Regenerate testdata/golden/<preset>.json for the tiny synthetic presets: synthesize each
# checkpoint (seed 0) and run scripts/hf_golden.py on it (HF transformers, float32, eager).
#
#   CGO_ENABLED=0 go build -o tilert . && scripts/golden_all.sh   # synthesize with ./tilert
#   CKPTS=DIR scripts/golden_all.sh     # use DIR/<preset>, already synthesized (e.g. carried to the H200)
#
#   KJV=DIR scripts/golden_all.sh       # also the trained models (testdata/models/*), prompts from
#                                        # DIR/val.txt (scripts/train_tiny.py corpus --out DIR)
#
# Env: OUT (default testdata/golden), PYTHON (default python3), SEED (default 0),
# PRESETS (default "deepseek-v3.2-tiny glm-5-tiny"), GOLDEN_ARGS (extra hf_golden.py flags), KJV.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-testdata/golden}
py=${PYTHON:-python3}
seed=${SEED:-0}
presets=${PRESETS:-"deepseek-v3.2-tiny glm-5-tiny"}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$py" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
rc=0
for p in $presets; do
	if [ -n "${CKPTS:-}" ]; then
		dir=$CKPTS/$p
	else
		dir=$work/$p
		if [ -x ./tilert ]; then
			./tilert synth --preset "$p" --out "$dir" --seed "$seed" || { rc=1; continue; }
		else
			go run . synth --preset "$p" --out "$dir" --seed "$seed" || { rc=1; continue; }
		fi
	fi
	# shellcheck disable=SC2086
	"$py" scripts/hf_golden.py --preset "$p" --model-dir "$dir" --seed "$seed" --out "$out/$p.json" ${GOLDEN_ARGS:-} || rc=1
done
if [ -n "${KJV:-}" ]; then
	for dir in testdata/models/*/; do
		[ -f "$dir/config.json" ] || continue
		p=$(basename "$dir")
		# shellcheck disable=SC2086
		"$py" scripts/hf_golden.py --preset "$p" --model-dir "$dir" --seed "$seed" --out "$out/$p.json" \
			--corpus "$KJV/val.txt" --tf-len 512 ${GOLDEN_ARGS:-} || rc=1
	done
fi
exit $rc

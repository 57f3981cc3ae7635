#!/usr/bin/env bash
# Gemma 3 270M through every `vocgraft` command a user runs, at small settings (a walk, not a measurement: that is
# benchmarks/gemma3.py): info, expand (mean; distill on a small budget), replace, train, eval, downstream,
# lm-eval-task, export gguf. Each command's exit status, seconds and last output lines go to
# benchmarks/results/gemma3_cli.md; a failing command does not stop the walk.
#
#     bash benchmarks/gemma3_cli.sh [WORK]        # WORK default ~/gemma3-work/cli; needs 'vocgraft[gemma3]'
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-$HOME/gemma3-work/cli}
CORPORA=${VOCGRAFT_CORPORA:-../shared/corpora}
OUT=benchmarks/results/gemma3_cli.md
V=.venv/bin/vocgraft
mkdir -p "$WORK"
rows=()

step() {  # step NAME COMMAND...: run it, keep its status, seconds and last lines
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$WORK/$name.log" 2>&1
  local rc=$? seconds=$((SECONDS - start))
  local tail
  tail=$(grep -v -E 'it/s\]|s/it\]|step/s\]|tensor/s\]|Warning|warn\(|^\s*$' "$WORK/$name.log" | tail -n 3 | cut -c1-200 |
    sed 's/|/\\|/g' | paste -sd ';' -)
  rows+=("| $name | \`${*/#$V/vocgraft}\` | $rc | $seconds | $tail |")
  echo "$name: rc $rc, ${seconds} s" >&2
}

heldout=$CORPORA/el/heldout.txt
step info $V info --model gemma3-270m
step expand-mean $V expand --model gemma3-270m --corpus "$CORPORA/el/train.txt" --sample 4096 --new-tokens 1000 \
  --init mean --out "$WORK/expand-mean" --overwrite --eval-limit 100
step expand-distill $V expand --model gemma3-270m --corpus "$CORPORA/el/train.txt" --sample 4096 --new-tokens 100 \
  --init distill --distill-snippets 2 --distill-epochs 1 --out "$WORK/expand-distill" --overwrite --eval-limit 100
step replace-mean $V replace --model gemma3-270m --corpus "$CORPORA/el/train.txt" --sample 4096 --vocab-size 8000 \
  --init mean --out "$WORK/replace-mean" --overwrite --eval-limit 100
step train $V train --model "$WORK/expand-mean" --corpus "$CORPORA/el/train.txt" --sample 512 --max-steps 4 \
  --seq-len 128 --batch-size 2 --warmup-steps 1 --val-lines 8 --out "$WORK/expand-mean-lapt" --overwrite
step eval $V eval --model "$WORK/expand-mean-lapt" --text "$heldout" --limit 100 --baseline-tokenizer gemma3-270m
step downstream $V downstream --model "$WORK/expand-mean-lapt" --baseline gemma3-270m --lang el --prompts "$heldout" \
  --num-prompts 4 --max-new-tokens 16 --mt "$CORPORA/parallel/en-el.tsv" --mt-limit 4 --json "$WORK/downstream.json"
step lm-eval-task $V lm-eval-task --model "$WORK/expand-mean-lapt" --text "$heldout" --limit 50 \
  --out "$WORK/lm-eval-task" --overwrite
step export-gguf $V export gguf --model "$WORK/expand-mean-lapt" --out "$WORK/expand-mean-lapt.gguf" --overwrite

{
  echo "# Gemma 3 270M through every vocgraft command"
  echo
  echo "$(date +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores."
  echo "Command: \`bash benchmarks/gemma3_cli.sh\`; small settings (a walk that every path runs, not a measurement;"
  echo "benchmarks/results/gemma3.md has the figures). Last lines: the command's output without progress bars."
  echo
  echo "| step | command | exit | seconds | last lines |"
  echo "| --- | --- | ---: | ---: | --- |"
  printf '%s\n' "${rows[@]}"
} >"$OUT"
echo "-> $OUT" >&2

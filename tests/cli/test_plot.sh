#!/usr/bin/env bash
# dspark plot: training curves from a run's metrics.jsonl, drawn by gnuplot. The data files hold
# exactly the records' values (train and held-out blocks), every PNG is a real PNG, a torn last
# line (a run still writing) is tolerated, a malformed earlier line is an error naming it, a
# folder of runs draws each run, and a machine without gnuplot gets an error naming the set-up.
#   test_plot.sh DSPARK TMPDIR
set -euo pipefail
dspark="$1"
tmp="$2"
rm -rf "$tmp"
mkdir -p "$tmp/runs/a" "$tmp/runs/b" "$tmp/runs/notarun"
fail=0
no() { echo "FAIL: $*"; fail=1; }

cat > "$tmp/runs/a/metrics.jsonl" <<'EOF'
{"kind":"train","step":1,"loss":4.5,"tau":1.25,"tokens":100,"lr":0.001,"elapsed_s":1}
{"kind":"train","step":2,"loss":4.0,"tau":1.5,"tokens":100,"lr":0.002,"elapsed_s":2}
{"kind":"eval","step":2,"loss":4.25,"tau":1.4,"accept_per_position":[0.5,0.25,0.125],"tokens":50,"elapsed_s":2}
{"kind":"train","step":3,"loss":3.5,"tau":1.75,"tokens":100,"lr":0.002,"elapsed_s":3}
{"kind":"eval","step":3,"loss":3.75,"tau":1.6,"accept_per_position":[0.625,0.375,0.25],"tokens":50,"elapsed_s":3}
{"kind":"train","step":4,"lo
EOF
cp "$tmp/runs/a/metrics.jsonl" "$tmp/runs/b/metrics.jsonl"

if ! "$dspark" plot "$tmp/runs/a" 2> "$tmp/err"; then no "plot of a run failed: $(cat "$tmp/err")"; fi
p="$tmp/runs/a/plots"
for m in loss tau lr accept_per_position; do
  [ -f "$p/$m.png" ] || { no "$m.png missing"; continue; }
  [ "$(head -c 8 "$p/$m.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || no "$m.png is not a PNG"
done
for m in tokens elapsed_s kind step; do [ ! -e "$p/$m.png" ] || no "bookkeeping field $m was plotted"; done
# loss: train block (steps 1..3), then the held-out block (steps 2, 3)
want="$(printf '1 4.5\n2 4\n3 3.5\n\n\n2 4.25\n3 3.75\n')"
got="$(grep -v '^#' "$p/loss.dat")"
[ "$got" = "$want" ] || no "loss.dat: got [$got] want [$want]"
grep -q "^3 0.25$" "$p/accept_per_position.dat" || no "accept_per_position.dat lacks the last evaluation's values"
grep -q "index 1" "$p/accept_per_position.gp" || no "accept_per_position.gp does not draw both evaluations"

# a metric only the evaluations report (a CE-only draft's acceptance): drawn from its one block
mkdir -p "$tmp/runs/c"
printf '%s\n' '{"kind":"train","step":1,"loss":4.5}' '{"kind":"eval","step":1,"loss":4.4,"accept_rate":0.25}' \
  '{"kind":"eval","step":2,"loss":4.2,"accept_rate":0.5}' > "$tmp/runs/c/metrics.jsonl"
"$dspark" plot "$tmp/runs/c" 2> "$tmp/err" || no "an eval-only metric failed: $(cat "$tmp/err")"
[ -f "$tmp/runs/c/plots/accept_rate.png" ] || no "eval-only accept_rate.png missing"

# a folder of runs: every run inside, into --out/RUN
if ! "$dspark" plot "$tmp/runs" --out "$tmp/all" 2> "$tmp/err"; then no "plot of a folder failed: $(cat "$tmp/err")"; fi
[ -f "$tmp/all/a/loss.png" ] && [ -f "$tmp/all/b/tau.png" ] || no "folder of runs: figures missing: $(ls -R "$tmp/all")"

# a malformed line before the last one names the file and the line
sed -i '2s/.*/{"kind":"train","step":2,,}/' "$tmp/runs/b/metrics.jsonl"
if "$dspark" plot "$tmp/runs/b" 2> "$tmp/err"; then no "a malformed line 2 was accepted"; fi
grep -q "metrics.jsonl" "$tmp/err" && grep -q "line 2" "$tmp/err" || no "malformed line error does not name file and line: $(cat "$tmp/err")"

# not a run
if "$dspark" plot "$tmp/runs/notarun" 2> "$tmp/err"; then no "an empty folder was accepted"; fi
grep -q "metrics.jsonl" "$tmp/err" || no "empty folder error unclear: $(cat "$tmp/err")"

# a speculation report: acceptance, tokens per round and calibration figures in plots/ beside it
cat > "$tmp/runs/spec.json" <<'EOF'
{"convention": "tau: tokens committed per target pass, bonus counted", "policy": "fixed", "tau": 2.5,
 "accept_conditional": [0.8, 0.5, 0.25], "accept_unconditional": [0.8, 0.4, 0.1],
 "tokens_per_round_histogram": [3, 5, 1, 1],
 "calibration": {"ece_raw": [0.2, 0.3, 0.1], "ece_calibrated": [0.05, 0.04, 0.02]}}
EOF
echo '{"not": "a report"}' > "$tmp/runs/other.json"
if ! "$dspark" plot "$tmp/runs/spec.json" 2> "$tmp/err"; then no "plot of a report failed: $(cat "$tmp/err")"; fi
for m in acceptance tokens-per-round calibration; do
  [ -f "$tmp/runs/plots/spec-$m.png" ] || no "spec-$m.png missing"
done
[ -z "$(ls "$tmp/runs" | grep -E '\.(png|gp|dat)$')" ] || no "figure files loose beside the report: $(ls "$tmp/runs")"
[ "$(grep -v '^#' "$tmp/runs/plots/spec-acceptance.dat")" = "$(printf '1 0.8 0.8\n2 0.5 0.4\n3 0.25 0.1')" ] ||
  no "spec-acceptance.dat: $(cat "$tmp/runs/plots/spec-acceptance.dat")"
grep -q "^2 5$" "$tmp/runs/plots/spec-tokens-per-round.dat" || no "histogram data wrong"
if "$dspark" plot "$tmp/runs/other.json" 2> "$tmp/err"; then no "a JSON that is not a report was accepted"; fi
grep -q "not a speculative-decoding report" "$tmp/err" || no "non-report error unclear: $(cat "$tmp/err")"
# with the rounds per position (a scheduler's report: position 3 never drafted): the tics count
# the rounds and the empty position gets no bar, not an ECE of 0
mkdir -p "$tmp/sched"
sed 's/"ece_calibrated": \[0.05, 0.04, 0.02\]}/"ece_calibrated": [0.05, 0.04, 0], "count": [22, 2, 0]}/' \
    "$tmp/runs/spec.json" > "$tmp/sched/spec.json"
grep -q '"count"' "$tmp/sched/spec.json" || no "test set-up: the report with counts"
"$dspark" plot "$tmp/sched/spec.json" 2> "$tmp/err" || no "a report with round counts failed: $(cat "$tmp/err")"
[ "$(grep -v '^#' "$tmp/sched/plots/spec-calibration.dat")" = "$(printf '1 0.2 0.05 22\n2 0.3 0.04 2\n3 0.1 0 0')" ] ||
  no "spec-calibration.dat with counts: $(cat "$tmp/sched/plots/spec-calibration.dat")"
grep -q "(\$4 > 0 ? \$2 : NaN):xtic(sprintf('%d (%d)', \$1, \$4))" "$tmp/sched/plots/spec-calibration.gp" ||
  no "calibration figure with counts: $(grep plot "$tmp/sched/plots/spec-calibration.gp")"
[ -f "$tmp/sched/plots/spec-calibration.png" ] || no "spec-calibration.png with counts missing"
grep -q "using 2:xtic(1)" "$tmp/runs/plots/spec-calibration.gp" || no "a report without counts: its plain tics"
# no position ever drafted (the scheduler decoded plainly or by prompt lookup throughout): the
# other figures, and no calibration figure, which gnuplot would refuse with every bar empty
mkdir -p "$tmp/undrafted"
sed 's/"ece_calibrated": \[0.05, 0.04, 0.02\]}/"ece_calibrated": [0, 0, 0], "count": [0, 0, 0]}/' \
    "$tmp/runs/spec.json" > "$tmp/undrafted/spec.json"
grep -q '"count": \[0, 0, 0\]' "$tmp/undrafted/spec.json" || no "test set-up: the report with no drafted position"
"$dspark" plot "$tmp/undrafted/spec.json" 2> "$tmp/err" || no "a report with no drafted position failed: $(cat "$tmp/err")"
[ -f "$tmp/undrafted/plots/spec-acceptance.png" ] && [ ! -f "$tmp/undrafted/plots/spec-calibration.png" ] ||
  no "a report with no drafted position: $(ls "$tmp/undrafted/plots")"
grep -q "no calibration figure" "$tmp/err" || no "a report with no drafted position: no note ($(cat "$tmp/err"))"

cp "$tmp/runs/a/metrics.jsonl" "$tmp/runs/b/metrics.jsonl" # b was broken above
"$dspark" plot "$tmp/runs" --out "$tmp/all2" 2> "$tmp/err" || no "a folder with a report and another JSON failed: $(cat "$tmp/err")"
[ -f "$tmp/all2/spec-calibration.png" ] || no "folder: the report's figures missing"

# a metric whose key is longer than 63 bytes is one curve like any other (fuzz/fuzz_plot found
# one figure drawn per record: the key was kept cut short and never matched again)
long="$(printf 'm%.0s' $(seq 70))"
mkdir -p "$tmp/long"
for s in 1 2 3; do printf '{"kind":"train","step":%d,"%s":%d.5}\n' "$s" "$long" "$s"; done > "$tmp/long/metrics.jsonl"
"$dspark" plot "$tmp/long" 2> "$tmp/err" || no "a long metric name failed: $(cat "$tmp/err")"
n="$(ls "$tmp/long/plots" | grep -c '\.png$' || true)"
[ "$n" = 1 ] || no "a long metric name gave $n figures, not 1: $(ls "$tmp/long/plots")"
[ "$(grep -v '^#' "$tmp/long/plots/${long:0:55}.dat" 2>&1)" = "$(printf '1 1.5\n2 2.5\n3 3.5')" ] ||
  no "a long metric name's data: $(cat "$tmp/long/plots/${long:0:55}.dat")"

# an evaluation's step past 2^31 names its vector as it is (fuzz/fuzz_plot found it converted to
# an int: undefined behaviour, "step -2147483648" here)
mkdir -p "$tmp/bigstep"
printf '%s\n' '{"kind":"eval","step":3000000000,"loss":2,"accept_per_position":[0.5,0.25]}' > "$tmp/bigstep/metrics.jsonl"
"$dspark" plot "$tmp/bigstep" 2> "$tmp/err" || no "a step past 2^31 failed: $(cat "$tmp/err")"
grep -q "title 'step 3000000000'" "$tmp/bigstep/plots/accept_per_position.gp" ||
  no "a step past 2^31: $(grep title "$tmp/bigstep/plots/accept_per_position.gp")"

# no gnuplot on PATH: the error names the set-up script
mkdir -p "$tmp/emptybin"
if PATH="$tmp/emptybin" "$dspark" plot "$tmp/runs/a" --out "$tmp/x" 2> "$tmp/err"; then no "ran without gnuplot"; fi
grep -q "setup.sh" "$tmp/err" || no "missing gnuplot error does not name scripts/setup.sh: $(cat "$tmp/err")"

[ "$fail" = 0 ] && echo "plot: all checks passed"
exit "$fail"

#!/usr/bin/env bash
# first-hour-timings.sh times a newcomer's first hour with the repository:
# `go run ./cmd/d1idem demo` (how long until its first line, and until it
# is done) and `make test`, each on a fresh clone of the current commit
# with empty Go build and module caches (GOCACHE, GOMODCACHE and GOPATH in
# a temporary directory) and, for make test, a fresh `npm ci` (an empty npm
# cache); then each again with those caches warm. It writes the figures,
# with the date and the commit, between the lines
#
#   <!-- timings:begin -->
#   <!-- timings:end -->
#
# of the Markdown file it is given, and leaves the rest of the file as it
# is. It needs bash, git, make, Go, and Node 20 with npm; it reaches the
# network only through the Go module proxy and the npm registry, as a
# fresh clone does. The cold run takes about 15 minutes of both cores:
# run it on a quiet machine.
#
# Usage: tools/first-hour-timings.sh [--fake] FILE.md
#
#   --fake  time quick stand-ins for the demo and make test (a fraction of
#           a second each), to check the script itself: the clones, the
#           caches, the timing and the rewriting of FILE.md.
set -euo pipefail

begin_marker='<!-- timings:begin -->'
end_marker='<!-- timings:end -->'

die() { echo "first-hour-timings: $*" >&2; keep_logs; exit 1; }
say() { echo "first-hour-timings: $*" >&2; }

usage() { sed -n 's/^# \{0,1\}//; /^Usage:/,/^set /p' "$0" | sed '$d'; }

fake=0
while [ $# -gt 0 ]; do
	case $1 in
	--fake) fake=1; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	-*) usage >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || { usage >&2; exit 2; }

md=$1
[ -f "$md" ] || die "no file $md"
md=$(cd "$(dirname "$md")" && pwd)/$(basename "$md")

# check_markers fails unless the file has each marker once, on a line of
# its own, the beginning first.
check_markers() {
	local b e
	b=$(grep -c -x -F -- "$begin_marker" "$1" || true)
	e=$(grep -c -x -F -- "$end_marker" "$1" || true)
	[ "$b" = 1 ] && [ "$e" = 1 ] || return 1
	[ "$(grep -n -x -F -- "$begin_marker" "$1" | cut -d: -f1)" -lt "$(grep -n -x -F -- "$end_marker" "$1" | cut -d: -f1)" ]
}
check_markers "$md" || die "$md needs the lines '$begin_marker' and '$end_marker', once each, in that order"

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse HEAD)
short=$(git -C "$root" rev-parse --short=12 HEAD)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
	say "the worktree has uncommitted changes: timing commit $short as committed"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/first-hour-timings.XXXXXX")
cleanup() { chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"; }
# keep_logs copies the logs out of $work, which cleanup removes, so that a
# failure's log can be read.
keep_logs() {
	if [ -d "${work:-}/logs" ]; then
		saved=$(mktemp -d "${TMPDIR:-/tmp}/first-hour-timings-logs.XXXXXX")
		cp -r "$work/logs/." "$saved/"
		echo "first-hour-timings: the logs are kept in $saved" >&2
	fi
}
trap cleanup EXIT

if [ $fake = 1 ]; then
	demo_cmd=(sh -c 'sleep 0.3; echo "d1idem demo: (a stand-in)"; sleep 0.4; echo done')
	test_cmd=(sh -c 'sleep 0.2; echo "workerd leg: NOT run: a stand-in"')
else
	demo_cmd=(go run ./cmd/d1idem demo)
	test_cmd=(make test)
fi

# now is the time in seconds, with a fraction.
now() {
	if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME/,/.}"; else date +%s.%N; fi
}

# since prints the seconds from $1 to $2: to a tenth under 10 s, else
# whole ones, rounded.
since() { awk -v a="$1" -v b="$2" 'BEGIN { d = b - a; if (d < 9.95) printf "%.1f", d; else printf "%d", d + 0.5 }'; }

# whole prints seconds rounded to whole ones.
whole() { awk -v d="$1" 'BEGIN { printf "%d", d + 0.5 }'; }

# minsec prints whole seconds as "X min Y s" (or "Y s").
minsec() {
	if [ "$1" -ge 60 ]; then echo "$(($1 / 60)) min $(($1 % 60)) s"; else echo "$1 s"; fi
}

# fresh makes a fresh clone of the commit under $work/$1 and empty Go and
# npm caches beside it, and moves there.
fresh() {
	local dir=$work/$1
	mkdir -p "$dir"
	git clone --quiet --no-checkout "$root" "$dir/clone"
	git -C "$dir/clone" fetch --quiet "$root" "$commit" 2>/dev/null || git -C "$dir/clone" fetch --quiet "$root" HEAD
	git -C "$dir/clone" checkout --quiet --detach "$commit"
	export GOCACHE=$dir/gocache GOMODCACHE=$dir/gomodcache GOPATH=$dir/gopath npm_config_cache=$dir/npm-cache
	export GOFLAGS="-modcacherw${GOFLAGS_USER:+ $GOFLAGS_USER}"
	cd "$dir/clone"
}
GOFLAGS_USER=${GOFLAGS:-}

# time_demo runs the demo, its output in $1, and sets first and end_s to
# the seconds until its first line and until it ended.
time_demo() {
	local log=$1 start t1 end status
	start=$(now)
	set +e
	"${demo_cmd[@]}" 2>&1 | {
		IFS= read -r line
		now >"$log.first"
		printf '%s\n' "$line"
		cat
	} >"$log"
	status=${PIPESTATUS[0]}
	set -e
	end=$(now)
	[ "$status" = 0 ] || die "the demo failed (exit $status); its output: $log"
	t1=$(cat "$log.first")
	first=$(since "$start" "$t1")
	end_s=$(since "$start" "$end")
	say "  first line after $first s: $(head -n 1 "$log")"
	say "  done in $end_s s"
}

# time_test runs make test, its output in $1, and sets took to its
# seconds and leg to its line saying whether the workerd leg ran.
time_test() {
	local log=$1 start end status
	start=$(now)
	set +e
	"${test_cmd[@]}" >"$log" 2>&1
	status=$?
	set -e
	end=$(now)
	[ "$status" = 0 ] || die "make test failed (exit $status); its output: $log"
	took=$(whole "$(since "$start" "$end")")
	leg=$(grep -m 1 '^workerd leg:' "$log" || tail -n 1 "$log")
	say "  took $(minsec "$took"); $leg"
}

keep=$work/logs
mkdir -p "$keep"
say "timing commit $short in $work (load average $(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo unknown))"

say "the demo, cold: a fresh clone, empty Go caches"
fresh demo
time_demo "$keep/demo-cold.log"
cold_first=$first cold_done=$end_s
say "the demo, warm"
time_demo "$keep/demo-warm.log"
warm_first=$first warm_done=$end_s

cd "$work"
chmod -R u+w "$work/demo" && rm -rf "$work/demo" # its caches are gigabytes

say "make test, cold: a fresh clone, empty Go caches and npm cache"
fresh test
time_test "$keep/test-cold.log"
test_cold=$took cold_leg=$leg
say "make test, warm"
time_test "$keep/test-warm.log"
test_warm=$took
go_version=$(go env GOVERSION 2>/dev/null || echo "go unknown")
cd "$root"

cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null || echo "?")
stand_in=""
[ $fake = 1 ] && stand_in=" (--fake: stand-ins, not the demo and make test)"
body=$work/body.md
cat >"$body" <<EOF
cold: first output after $cold_first s, demo done in $cold_done s; make test $(minsec "$test_cold") (cold), $(minsec "$test_warm") (warm); warm, the demo's first output after $warm_first s, done in $warm_done s.
Measured$stand_in by \`tools/first-hour-timings.sh\` on $(date -u +%Y-%m-%d), commit $short, $(uname -sm), $cpus CPUs, $go_version: cold is a fresh clone with empty Go build and module caches (and, for \`make test\`, a fresh \`npm ci\`), warm is the same clone run again; \`make test\` said "$cold_leg".
EOF

out=$work/out.md
awk -v body="$body" -v b="$begin_marker" -v e="$end_marker" '
	$0 == b { print; while ((getline line < body) > 0) print line; skip = 1; next }
	$0 == e { skip = 0 }
	!skip { print }
' "$md" >"$out"
cat "$out" >"$md"
say "wrote the figures into $md:"
cat "$body" >&2

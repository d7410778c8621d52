#!/bin/sh
# install.sh MESON BUILD_DIR SOURCE_DIR: libparasol as a program outside the tree uses it.
# Installs the build into a temporary root (meson install --destdir), then builds
# examples/simulate.c and the example search plugin (search/plugins/example.c) with the
# flags `pkg-config --cflags --libs parasol` gives and nothing else, and runs them: the C
# example must print the iteration time `parasol simulate` prints for the same plan, and
# the installed program must load the plugin and run its algorithm.
set -eu
meson=$1
build=$2
src=$3
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$root" >/dev/null
pc=$(find "$root" -name parasol.pc)
if [ -z "$pc" ]; then
  echo "install.sh: no parasol.pc under $root" >&2
  exit 1
fi
for f in include/parasol/parasol.h include/parasol/parasol-sim.h \
         include/parasol/parasol-sim-core.h include/parasol/parasol-sim-plan.h \
         include/parasol/parasol-search.h include/parasol/parasol-profile.h \
         include/parasol/parasol-exec.h bin/parasol; do
  if [ -z "$(find "$root" -path "*/$f")" ]; then
    echo "install.sh: $f was not installed" >&2
    exit 1
  fi
done
soname=$(find "$root" -name 'libparasol.so.*.*' | head -n 1)
if [ -z "$soname" ] || ! objdump -p "$soname" | grep -q 'SONAME *libparasol\.so\.[0-9]'; then
  echo "install.sh: no libparasol.so with a versioned soname under $root" >&2
  exit 1
fi

# parasol.pc names its prefix relative to its own place (meson's pkgconfig.relocatable,
# the project's default), so the tree works where it was copied.
if ! grep -q '^prefix=${pcfiledir}' "$pc"; then
  echo "install.sh: skipped: parasol.pc has an absolute prefix (a build set up before the" \
       "project made it relocatable: meson configure -Dpkgconfig.relocatable=true)" >&2
  exit 77
fi
export PKG_CONFIG_PATH="$(dirname "$pc")"
flags=$(pkg-config --cflags --libs parasol)
echo "pkg-config --cflags --libs parasol: $flags"
libdir=$(pkg-config --libs-only-L parasol | sed 's/^ *-L//; s/ .*//')
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
parasol=$(find "$root" -path '*/bin/parasol')

cd "$tmp"
# shellcheck disable=SC2086
"$cc" -std=c17 -Wall -Werror "$src/examples/simulate.c" $flags -o simulate
# shellcheck disable=SC2086
"$cc" -std=c17 -Wall -Werror -shared -fPIC "$src/search/plugins/example.c" $flags \
  -o parasol-search-example.so

./simulate resnet-50 dgx-a100 | tee simulate.out
got=$(sed -n 's/^iteration \([0-9.]*\) ms.*/\1/p' simulate.out)
want=$("$parasol" simulate --model resnet-50 --machine dgx-a100 --json |
       python3 -c 'import json, sys; print("%.3f" % (json.load(sys.stdin)["iteration_time_s"] * 1e3))')
if [ "$got" != "$want" ]; then
  echo "install.sh: the example's iteration time $got ms differs from parasol simulate's $want ms" >&2
  exit 1
fi

"$parasol" search --plugin ./parasol-search-example.so --algo random --model mlp \
  --machine dgx-a100 --budget 30evals --seed 1 --log search.csv | tee search.out
grep -q 'random' search.out
if [ "$(wc -l < search.csv)" -lt 2 ]; then
  echo "install.sh: the plugin's search logged no improvement" >&2
  exit 1
fi
echo "install.sh: installed library, headers and parasol.pc work out of the tree"

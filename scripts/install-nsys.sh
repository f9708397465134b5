#!/usr/bin/env bash
# Install the Nsight Systems CLI (`nsys`) that Debian bookworm ships in its non-free component
# into PREFIX, for machines where NVIDIA's own installer is not at hand (CI, CPU-only boxes).
# On a machine without a GPU this nsys still records NVTX ranges and OS runtime calls, turns
# them into a .nsys-rep, exports SQLite and runs `nsys stats`.
#
#   usage: scripts/install-nsys.sh [PREFIX]      (default: .tools/nsys)
#   then:  PREFIX/bin/nsys --version
#
# The system's apt sources, lists and caches are left alone: apt runs with a private state
# directory and a sources file of its own, downloads the .deb files and they are unpacked with
# `dpkg-deb -x` under PREFIX/root. Nothing is installed system-wide and no root is needed
# beyond what apt-get download wants. The binaries are NVIDIA's, under NVIDIA's licence:
# install them, never commit them.
set -euo pipefail

prefix=${1:-.tools/nsys}
suite=bookworm
packages=(nsight-systems nsight-systems-target libssh-4)
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

die() { echo "install-nsys: $*" >&2; exit 1; }

if [[ -x $prefix/bin/nsys ]] && "$prefix/bin/nsys" --version >/dev/null 2>&1; then
  echo "nsys already installed: $prefix/bin/nsys"
  exit 0
fi

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "no $tool here (not a Debian-like system): install Nsight Systems from NVIDIA (https://developer.nvidia.com/nsight-systems) and put nsys on PATH"
done
[[ $(uname -m) == x86_64 ]] ||
  die "Debian packages Nsight Systems for x86_64 only, this is $(uname -m): install it from NVIDIA (https://developer.nvidia.com/nsight-systems) and put nsys on PATH"
[[ -r $keyring ]] ||
  die "no Debian archive keyring at $keyring: install Nsight Systems from NVIDIA (https://developer.nvidia.com/nsight-systems) and put nsys on PATH"

# The machine's own Debian mirror when it names one (it may be a local proxy), else the CDN.
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/*$/\1/p' \
           /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}

work=$(mktemp -d)
staging=
trap 'rm -rf "$work" ${staging:+"$staging"}' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/parts" "$work/debs"
cat >"$work/nsys.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite
Components: main non-free
Signed-By: $keyring
EOF

apt_opts=(
  -qq
  -o "Dir::Etc::SourceList=$work/nsys.sources"
  -o "Dir::Etc::SourceParts=$work/parts"
  -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache"
  -o "APT::Architecture=amd64"
)
# As root apt would hand downloads to the `_apt` user, who cannot write into our private
# temp dir; it then falls back with a warning. Say up front that root downloads.
[[ $(id -u) -eq 0 ]] && apt_opts+=(-o "APT::Sandbox::User=root")

echo "install-nsys: fetching ${packages[*]} from $mirror $suite"
apt-get "${apt_opts[@]}" update || die "apt-get update against $mirror $suite failed"
(cd "$work/debs" && apt-get "${apt_opts[@]}" download "${packages[@]}") ||
  die "apt-get download ${packages[*]} failed"

# Unpack into a fresh tree and move it into place at the end, so an interrupted run never
# leaves a half-unpacked PREFIX/root behind.
mkdir -p "$prefix"
staging=$(mktemp -d "$prefix/.root.XXXXXX")
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$staging"; done

# Debian splits Nsight Systems across two folders:
#   usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64   nsys itself (the collector)
#   usr/lib/nsight-systems/host-linux-x64                      QdstrmImporter, exporter, stats
# nsys looks for the host tools beside its own folder (../host-linux-x64 from the real path
# of the binary); without that link `nsys profile` records but never writes a .nsys-rep.
target=usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64
host=usr/lib/nsight-systems/host-linux-x64
[[ -x $staging/$target/nsys && -d $staging/$host ]] ||
  die "unexpected package layout: no $target/nsys or no $host"
ln -sfn ../../nsight-systems/host-linux-x64 "$staging/$(dirname "$target")/host-linux-x64"
# The importer links against libssh.so (RPATH $ORIGIN); the package's link points at
# usr/lib/x86_64-linux-gnu/libssh.so.4, which libssh-4 unpacked into the same tree.
[[ -e $staging/$host/libssh.so ]] || die "libssh.so not found beside the host tools"

rm -rf "$prefix/root"
mv "$staging" "$prefix/root"
staging=

root_abs=$(cd "$prefix/root" && pwd)
mkdir -p "$prefix/bin"
cat >"$prefix/bin/nsys.tmp" <<EOF
#!/bin/sh
# Nsight Systems CLI unpacked from Debian $suite by install-nsys.sh.
exec "$root_abs/$target/nsys" "\$@"
EOF
chmod +x "$prefix/bin/nsys.tmp"
mv "$prefix/bin/nsys.tmp" "$prefix/bin/nsys"

"$prefix/bin/nsys" --version

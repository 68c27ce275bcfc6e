#!/bin/bash
# Copyright The goroce Authors.
# SPDX-License-Identifier: Apache-2.0
#
# build.sh - build (or reuse) the rxe-lab guest: Debian kernel + initramfs
# with busybox, the Soft-RoCE (rdma_rxe) modules and rdma-core tools.
#
#   build.sh [--force] [--refresh] [--quiet]
#     --force    rebuild the initramfs even if the cached one is current
#     --refresh  re-resolve and re-download the Debian packages (new kernel ABI...)
#
# Everything goes under $RXE_LAB_CACHE (default /var/cache/goroce/rxe-lab):
#   debs/    downloaded .deb files (apt-get download, never installed)
#   stage/   the .debs unpacked with dpkg-deb -x (removed after a build unless
#            RXE_LAB_KEEP_STAGE=1)
#   rootfs/  the initramfs tree
#   out/     vmlinuz, initrd.img, manifest   <- what rxe-lab boots
# Idempotent: if out/manifest carries the hash of this script and guest/*,
# nothing is done.
set -euo pipefail

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
CACHE=${RXE_LAB_CACHE:-/var/cache/goroce/rxe-lab}
FORCE=0 REFRESH=0 QUIET=0
for a in "$@"; do
	case "$a" in
	--force) FORCE=1 ;;
	--refresh) REFRESH=1 FORCE=1 ;;
	--quiet) QUIET=1 ;;
	-h|--help) sed -n '5,20p' "$0"; exit 0 ;;
	*) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
	esac
done
say() { [ "$QUIET" = 1 ] || echo "build: $*" >&2; }
die() { echo "build: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get, mknod, depmod)"
# Another apt/dpkg run (unattended upgrades, a CI step) may hold the locks: wait
# for it instead of failing.
APT_LOCK="-o DPkg::Lock::Timeout=${RXE_LAB_APT_LOCK_TIMEOUT:-900}"

# Packages unpacked for the guest (never installed on the host).
GUEST_PKGS=(busybox-static iproute2 ibverbs-utils ibverbs-providers libibverbs1
	librdmacm1 rdmacm-utils perftest libibumad3 libpci3 libnl-3-200 libnl-route-3-200
	libc6 libgcc-s1 libbpf1 libelf1 libcap2 libmnl0 libbsd0 libmd0 libudev1 zlib1g)
# Host tools this lab needs (installed on the host if missing).
HOST_PKGS=(qemu-system-x86 kmod binutils cpio gzip tcpdump tshark)
# Kernel modules wanted in the guest (dependencies are added from modules.dep).
WANT_MODS=(virtio_pci virtio_net e1000 9pnet_virtio 9p crc32_generic crc32c_generic
	ib_core ib_uverbs ib_umad rdma_cm rdma_ucm rdma_rxe)
# Binaries copied from the unpacked packages (path inside stage -> same path in rootfs).
TOOLS=(usr/bin/ibv_devinfo usr/bin/ibv_devices usr/bin/ibv_rc_pingpong usr/bin/ibv_uc_pingpong
	usr/bin/ibv_ud_pingpong usr/bin/ibv_srq_pingpong usr/bin/ibv_xsrq_pingpong usr/bin/ibv_asyncwatch
	usr/bin/ib_write_bw usr/bin/ib_write_lat usr/bin/ib_read_bw usr/bin/ib_read_lat
	usr/bin/ib_send_bw usr/bin/ib_send_lat usr/bin/ib_atomic_bw usr/bin/ib_atomic_lat
	usr/bin/rping usr/bin/rstream usr/bin/riostream usr/bin/ucmatose usr/bin/udaddy
	usr/bin/mckey usr/bin/rcopy usr/bin/rdma_client usr/bin/rdma_server usr/bin/rdma_xclient
	usr/bin/rdma_xserver usr/bin/cmtime usr/bin/udpong
	usr/bin/rdma sbin/ip sbin/bridge)

# ---------------------------------------------------------------------------
install_host_deps() {
	local missing=() p
	command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
	command -v depmod >/dev/null || missing+=(kmod)
	command -v readelf >/dev/null || missing+=(binutils)
	command -v cpio >/dev/null || missing+=(cpio)
	command -v tcpdump >/dev/null || missing+=(tcpdump)
	command -v tshark >/dev/null || missing+=(tshark)
	[ ${#missing[@]} = 0 ] && return 0
	say "installing host packages: ${missing[*]}"
	apt-get $APT_LOCK update -qq || true
	DEBIAN_FRONTEND=noninteractive apt-get $APT_LOCK install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

recipe_hash() {
	cat "$HERE/build.sh" "$HERE"/guest/* | sha256sum | cut -c1-16
}

install_host_deps
KEY=$(recipe_hash)
# One build at a time per cache (parallel "up"s, several test binaries).
mkdir -p "$CACHE"
exec 8>"$CACHE/.build.lock"
flock 8
OUT=$CACHE/out
if [ "$FORCE" = 0 ] && [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.img" ] &&
	grep -qx "recipe=$KEY" "$OUT/manifest" 2>/dev/null; then
	say "up to date ($OUT, recipe $KEY)"
	exit 0
fi

mkdir -p "$CACHE/debs"
cd "$CACHE/debs"
chmod 755 "$CACHE" "$CACHE/debs" # lets apt's _apt user write here (no sandbox warning)

# --- resolve the kernel package ------------------------------------------------
KPKG=${RXE_LAB_KERNEL_PKG:-}
if [ -z "$KPKG" ] && [ "$REFRESH" = 0 ]; then
	KPKG=$(cat "$CACHE/debs/.kernel-pkg" 2>/dev/null || true)
fi
if [ -z "$KPKG" ]; then
	KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
	if [ -z "$KPKG" ]; then
		say "apt lists empty? running apt-get update"
		apt-get $APT_LOCK update -qq
		KPKG=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
	fi
	[ -n "$KPKG" ] || die "cannot resolve the kernel package behind linux-image-amd64"
	echo "$KPKG" > "$CACHE/debs/.kernel-pkg"
fi
say "kernel package: $KPKG"

# --- download ---------------------------------------------------------------
if [ "$REFRESH" = 1 ]; then rm -f "$CACHE"/debs/*.deb; fi
need=()
for p in "$KPKG" "${GUEST_PKGS[@]}"; do
	compgen -G "${p}_*.deb" >/dev/null || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	say "downloading: ${need[*]}"
	if ! apt-get download -q "${need[@]}" >/dev/null 2>"$CACHE/debs/.apt.err"; then
		apt-get $APT_LOCK update -qq
		apt-get download -q "${need[@]}" >/dev/null 2>"$CACHE/debs/.apt.err" ||
			die "apt-get download failed: $(cat "$CACHE/debs/.apt.err")"
	fi
fi

# --- unpack -----------------------------------------------------------------
STAGE=$CACHE/stage
rm -rf "$STAGE"; mkdir -p "$STAGE"
for p in "$KPKG" "${GUEST_PKGS[@]}"; do
	f=$(ls -1 "${p}"_*.deb | sort -V | tail -1)
	dpkg-deb -x "$f" "$STAGE"
	echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version)"
done > "$CACHE/debs/.versions"
KVER=$(ls -1 "$STAGE/lib/modules" | head -1)
[ -f "$STAGE/boot/vmlinuz-$KVER" ] || die "no vmlinuz for $KVER"
depmod -b "$STAGE" "$KVER"
say "unpacked $(wc -l < "$CACHE/debs/.versions") packages, kernel $KVER"

# --- rootfs -----------------------------------------------------------------
R=$CACHE/rootfs
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu/libibverbs,lib64} \
	"$R"/{etc/libibverbs.d,etc/rxelab,proc,sys,dev,tmp,run,root,mnt/lab,mnt/host,var/tmp}
chmod 1777 "$R/tmp" "$R/var/tmp"

for t in "${TOOLS[@]}"; do
	[ -e "$STAGE/$t" ] || die "missing tool $t in the unpacked packages"
	mkdir -p "$R/$(dirname "$t")"
	cp -L "$STAGE/$t" "$R/$t"
done
ln -s ../sbin/ip "$R/bin/ip"
cp "$STAGE/bin/busybox" "$R/bin/busybox"
# busybox applet links, where no real tool sits already
while read -r a; do
	[ -e "$R/$a" ] || [ -L "$R/$a" ] || ln -s /bin/busybox "$R/$a"
done < <("$R/bin/busybox" --list-full)
ln -sf bin/busybox "$R/init"

# libibverbs provider: only rxe (so no "couldn't load driver" noise)
cp "$STAGE/etc/libibverbs.d/rxe.driver" "$R/etc/libibverbs.d/"
cp -L "$STAGE"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so "$R/usr/lib/x86_64-linux-gnu/libibverbs/"

# shared libraries: closure over DT_NEEDED, searched in the unpacked packages
LIBDIRS=("$STAGE/lib/x86_64-linux-gnu" "$STAGE/usr/lib/x86_64-linux-gnu")
declare -A have=()
from_host=()
LIB=
find_lib() { # sets LIB to the path of library $1; prefers the unpacked packages
	local n=$1 d
	for d in "${LIBDIRS[@]}"; do [ -e "$d/$n" ] && { LIB=$d/$n; return 0; }; done
	for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
		[ -e "$d/$n" ] && { from_host+=("$n"); LIB=$d/$n; return 0; }
	done
	return 1
}
# dlopen()ed by glibc (pthread_exit/cancel unwinding: rping needs it)
for n in libgcc_s.so.1; do find_lib "$n" && cp -L "$LIB" "$R/lib/x86_64-linux-gnu/$n"; have[$n]=1; done
queue=()
while IFS= read -r f; do queue+=("$f"); done < <(find "$R" -type f -perm -u+x ! -name busybox; find "$R/usr/lib" -name '*.so')
while [ ${#queue[@]} -gt 0 ]; do
	f=${queue[0]}; queue=("${queue[@]:1}")
	file_is_elf=$(head -c4 "$f" | od -An -c | tr -d ' ')
	[ "$file_is_elf" = '177ELF' ] || continue
	for n in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		[ -n "${have[$n]:-}" ] && continue
		find_lib "$n" || die "library $n (needed by ${f#$R}) not found"
		have[$n]=1
		cp -L "$LIB" "$R/lib/x86_64-linux-gnu/$n"
		queue+=("$R/lib/x86_64-linux-gnu/$n")
	done
done
cp -L "$STAGE/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$R/lib/x86_64-linux-gnu/"
ln -sf ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$R/lib64/ld-linux-x86-64.so.2"
printf '/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' > "$R/etc/ld.so.conf"
ldconfig -r "$R" 2>/dev/null || true
[ ${#from_host[@]} = 0 ] || say "WARNING: libraries taken from the host: ${from_host[*]}"

# kernel modules: dependency closure, load order = deps first
M=lib/modules/$KVER
declare -A deps=() done_mod=()
while IFS= read -r line; do
	k=${line%%:*}; deps[$k]=${line#*:}
done < "$STAGE/$M/modules.dep"
modpath() { # module name -> path relative to lib/modules/KVER
	local n=$1 k
	for k in "${!deps[@]}"; do
		b=${k##*/}; b=${b%.ko}
		[ "$b" = "$n" ] || [ "$b" = "${n//_/-}" ] && { echo "$k"; return; }
	done
	return 1
}
order=()
visit() {
	local k=$1 d
	[ -n "${done_mod[$k]:-}" ] && return
	done_mod[$k]=1
	for d in ${deps[$k]}; do visit "$d"; done
	order+=("$k")
}
for m in "${WANT_MODS[@]}"; do
	k=$(modpath "$m") || die "module $m not found in $KVER"
	visit "$k"
done
for k in "${order[@]}"; do
	mkdir -p "$R/$M/$(dirname "$k")"
	cp "$STAGE/$M/$k" "$R/$M/$k"
done
cp "$STAGE/$M"/modules.{order,builtin,builtin.modinfo} "$R/$M/"
depmod -b "$R" "$KVER"
printf '%s\n' "${order[@]}" > "$R/etc/rxelab/modules.load"

# config files and the guest scripts
install -m 644 "$HERE/guest/inittab" "$R/etc/inittab"
install -m 755 "$HERE/guest/boot.sh" "$HERE/guest/jobloop.sh" "$HERE/guest/runjob.sh" "$R/etc/rxelab/"
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'root:x:0:' > "$R/etc/group"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
printf 'hosts: files\npasswd: files\ngroup: files\n' > "$R/etc/nsswitch.conf"
mknod -m 600 "$R/dev/console" c 5 1
mknod -m 666 "$R/dev/null" c 1 3
{
	echo "recipe=$KEY"
	echo "kernel=$KVER"
	echo "kernel_pkg=$KPKG"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	sed 's/^/pkg=/' "$CACHE/debs/.versions"
	sed 's/^/module=/' "$R/etc/rxelab/modules.load"
} > "$R/etc/rxelab/manifest"

# --- pack -------------------------------------------------------------------
mkdir -p "$OUT"
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -6 > "$OUT/initrd.img.new"
cp "$STAGE/boot/vmlinuz-$KVER" "$OUT/vmlinuz.new"
mv "$OUT/initrd.img.new" "$OUT/initrd.img"
mv "$OUT/vmlinuz.new" "$OUT/vmlinuz"
cp "$R/etc/rxelab/manifest" "$OUT/manifest"
# the unpacked packages (~430 MB, mostly kernel modules) are not needed any more
[ "${RXE_LAB_KEEP_STAGE:-0}" = 1 ] || rm -rf "$STAGE"
say "built $OUT: vmlinuz $(du -h "$OUT/vmlinuz" | cut -f1), initrd.img $(du -h "$OUT/initrd.img" | cut -f1), recipe $KEY"

#!/bin/sh
# Copyright The goroce Authors.
# SPDX-License-Identifier: Apache-2.0
#
# rxe-lab guest: one-time boot (run by busybox init as ::sysinit).
# Reads its settings from /proc/cmdline (rxelab.KEY=VALUE), loads the kernel
# modules, configures eth0, creates the Soft-RoCE device rxe0 and reports
# readiness on the console and in the 9p share (/mnt/lab/ready).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
umask 022

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /tmp /run /mnt/lab /mnt/host /root
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t configfs configfs /sys/kernel/config 2>/dev/null

log() { echo "rxelab: $*" > /dev/console; }
log_pipe() { while read -r l; do log "$l"; done; }
# expand6 ADDR: IPv6 address in the 8-group form of /sys/class/infiniband/*/gids/*
expand6() {
	echo "$1" | awk '{
		a = tolower($0); l = a; r = ""
		if (index(a, "::")) { l = substr(a, 1, index(a, "::") - 1); r = substr(a, index(a, "::") + 2) }
		nl = (l == "") ? 0 : split(l, L, ":")
		nr = (r == "") ? 0 : split(r, R, ":")
		out = ""
		for (i = 1; i <= nl; i++) out = out substr("0000" L[i], length(L[i]) + 1) ":"
		for (i = 0; i < 8 - nl - nr; i++) out = out "0000:"
		for (i = 1; i <= nr; i++) out = out substr("0000" R[i], length(R[i]) + 1) ":"
		print substr(out, 1, length(out) - 1)
	}'
}
gidof6() { grep -qsx "$(expand6 "$1")" /sys/class/infiniband/rxe0/ports/1/gids/*; }
up() { cut -d' ' -f1 /proc/uptime; }

# --- parameters -------------------------------------------------------------
P_name=guest P_addr= P_addr6= P_mtu=1500 P_rxe=1 P_mode=daemon P_cmd= P_share=1 \
P_hostshare=0 P_ipv6=0 P_poll=0.1 P_idle_poll=0.5
for kv in $(cat /proc/cmdline); do
	case "$kv" in
	rxelab.*=*)
		k=${kv#rxelab.}; k=${k%%=*}; v=${kv#*=}
		case "$k" in *[!a-z0-9_]*) continue ;; esac
		eval "P_$k=\$v"
		;;
	esac
done
hostname "$P_name"
{
	for v in name addr addr6 mtu rxe mode share hostshare ipv6 poll idle_poll; do
		eval "echo $v=\$P_$v"
	done
} > /run/rxelab.env

# --- kernel modules (order computed at build time from modules.dep) ---------
while read -r m; do
	[ -n "$m" ] || continue
	insmod "/lib/modules/$(uname -r)/$m" 2>/tmp/insmod.err ||
		grep -q 'File exists' /tmp/insmod.err || log "insmod $m failed: $(cat /tmp/insmod.err)"
done < /etc/rxelab/modules.load
log "modules loaded t=$(up)"

# --- shares -----------------------------------------------------------------
if [ "$P_share" = 1 ]; then
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none lab /mnt/lab ||
		log "9p share 'lab' not mounted"
fi
if [ "$P_hostshare" = 1 ]; then
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none host /mnt/host ||
		log "9p share 'host' not mounted"
fi

# --- network ----------------------------------------------------------------
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
if [ "$P_ipv6" != 1 ]; then
	sysctl -qw net.ipv6.conf.all.disable_ipv6=1
	sysctl -qw net.ipv6.conf.default.disable_ipv6=1
	sysctl -qw net.ipv6.conf.eth0.disable_ipv6=1
fi
ip link set eth0 mtu "$P_mtu" || log "cannot set mtu $P_mtu"
[ -n "$P_addr" ] && ip addr add "$P_addr" dev eth0
# /sbin/ip, not the busybox applet that "ip" runs in this shell: it lacks nodad.
[ -n "$P_addr6" ] && [ "$P_ipv6" = 1 ] && { /sbin/ip -6 addr add "$P_addr6" dev eth0 nodad 2>&1 | log_pipe || true; }
ip link set eth0 up
i=0
while ! grep -q 1 /sys/class/net/eth0/carrier 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
log "eth0 up mtu=$(cat /sys/class/net/eth0/mtu) mac=$(cat /sys/class/net/eth0/address) addr=$P_addr t=$(up)"

# --- Soft-RoCE --------------------------------------------------------------
status=ok
if [ "$P_rxe" = 1 ]; then
	if rdma link add rxe0 type rxe netdev eth0 2>/tmp/rxe.err; then
		i=0
		until rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE' || [ $i -ge 100 ]; do
			sleep 0.1; i=$((i+1))
		done
		rdma link show rxe0/1 | grep -q 'state ACTIVE' || status="rxe0 not ACTIVE"
		# wait until the IPv4 GID (::ffff:a.b.c.d) is in the table
		i=0
		while [ -n "$P_addr" ] && [ $i -lt 100 ]; do
			grep -qs "0000:0000:0000:0000:0000:ffff" /sys/class/infiniband/rxe0/ports/1/gids/* && break
			sleep 0.1; i=$((i+1))
		done
		# and, with rxelab.addr6, until that address is a GID too
		if [ -n "$P_addr6" ] && [ "$P_ipv6" = 1 ]; then
			i=0
			until gidof6 "${P_addr6%/*}" || [ $i -ge 100 ]; do sleep 0.1; i=$((i+1)); done
			gidof6 "${P_addr6%/*}" || status="IPv6 GID for $P_addr6 missing"
		fi
	else
		status="rdma link add failed: $(cat /tmp/rxe.err)"
	fi
fi
T_READY=$(up)

# --- report -----------------------------------------------------------------
{
	echo "name=$P_name"
	echo "status=$status"
	echo "uptime_ready=$T_READY"
	echo "kernel=$(uname -r)"
	echo "addr=$P_addr"
	echo "addr6=$P_addr6"
	echo "mac=$(cat /sys/class/net/eth0/address 2>/dev/null)"
	echo "netdev_mtu=$(cat /sys/class/net/eth0/mtu 2>/dev/null)"
	if [ -d /sys/class/infiniband/rxe0 ]; then
		p=/sys/class/infiniband/rxe0/ports/1
		echo "rdma_link=$(rdma link show rxe0/1 2>/dev/null)"
		echo "active_mtu=$(ibv_devinfo -d rxe0 2>/dev/null | sed -n 's/.*active_mtu:[[:space:]]*//p')"
		for g in 0 1 2 3 4 5 6 7; do
			[ -r $p/gids/$g ] || continue
			gid=$(cat $p/gids/$g 2>/dev/null)
			[ "$gid" = "0000:0000:0000:0000:0000:0000:0000:0000" ] && continue
			echo "gid$g=$gid $(cat $p/gid_attrs/types/$g 2>/dev/null)"
		done
	fi
} > /run/ready
log "rxe ready status=$status t=$T_READY"
sed 's/^/rxelab:   /' /run/ready > /dev/console
if grep -q ' /mnt/lab ' /proc/mounts; then
	cp /run/ready /mnt/lab/.ready.tmp && mv /mnt/lab/.ready.tmp /mnt/lab/ready
fi

# --- optional command from the kernel command line (base64 of a sh script) --
if [ -n "$P_cmd" ]; then
	echo "$P_cmd" | base64 -d > /run/cmdline.sh 2>/dev/null
	echo "rxelab: ---- cmd output begin ----" > /dev/console
	(cd /root && sh /run/cmdline.sh) < /dev/null > /dev/console 2>&1
	rc=$?
	echo "rxelab: ---- cmd output end ----" > /dev/console
	log "cmd exit=$rc"
	if [ "$P_mode" = oneshot ]; then
		sync; poweroff -f
	fi
fi
exit 0

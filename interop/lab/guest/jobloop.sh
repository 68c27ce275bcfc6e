#!/bin/sh
# Copyright The goroce Authors.
# SPDX-License-Identifier: Apache-2.0
#
# rxe-lab guest: job spool poller (respawned by busybox init).
# The host drops jobs into the 9p share (/mnt/lab/jobs/ID/{cmd,stdin,go});
# each job runs in its own session; stdout/stderr/exit code go back into
# the job folder (out, err, rc).  See runjob.sh.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
J=/mnt/lab/jobs
POLL=0.1        # poll interval while jobs come in
IDLE_POLL=0.5   # poll interval after 10 s without a new job
[ -r /run/rxelab.env ] && . /run/rxelab.env
[ -n "${poll:-}" ] && POLL=$poll
[ -n "${idle_poll:-}" ] && IDLE_POLL=$idle_poll
if ! grep -q ' /mnt/lab ' /proc/mounts; then
	# no share: nothing to poll; idle (init respawns us if we ever exit)
	exec sleep 2147483647
fi
mkdir -p "$J"
# sleep without forking: read with a timeout on a FIFO nobody writes to
mkfifo /run/jobloop.fifo 2>/dev/null
exec 3<>/run/jobloop.fifo
idle=0
while :; do
	for g in "$J"/*/go; do
		[ -e "$g" ] || continue
		d=${g%/go}
		mv "$g" "$d/taken" 2>/dev/null || continue
		idle=0
		# double fork: the job is reparented to init, which reaps it
		( /etc/rxelab/runjob.sh "$d" 3<&- & )
	done
	for c in "$J"/*/cancel; do
		[ -e "$c" ] || continue
		d=${c%/cancel}
		mv "$c" "$d/cancelled" 2>/dev/null || continue
		p=$(cat "$d/pid" 2>/dev/null)
		if [ -n "$p" ]; then
			kill -TERM -"$p" 2>/dev/null
			( (sleep 3; kill -KILL -"$p" 2>/dev/null) & )
		fi
	done
	if [ -e /mnt/lab/poweroff ]; then
		echo "rxelab: poweroff requested" > /dev/console
		sync; poweroff -f
	fi
	if [ $idle -lt 100 ]; then
		idle=$((idle+1))
		read -r -t "$POLL" _ <&3
	else
		read -r -t "$IDLE_POLL" _ <&3
	fi
done

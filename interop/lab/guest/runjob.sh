#!/bin/sh
# Copyright The goroce Authors.
# SPDX-License-Identifier: Apache-2.0
#
# rxe-lab guest: run one spooled job.  $1 = job folder in the 9p share.
#   in : cmd (sh script), stdin (optional), poweroff (optional flag)
#   out: pid (session id of the job), out, err, rc (written last, atomically)
d=$1
in=/dev/null
[ -e "$d/stdin" ] && in="$d/stdin"
cd /root
# setsid: the job gets its own session/process group so that a cancel can
# kill everything it started.  We are not a group leader here, so busybox
# setsid does not fork and the exit status is the job's.
setsid sh -c 'echo $$ > "$0/pid"; exec sh "$0/cmd"' "$d" < "$in" > "$d/out" 2> "$d/err"
rc=$?
echo "$rc" > "$d/rc.tmp"
mv "$d/rc.tmp" "$d/rc"
if [ -e "$d/poweroff" ]; then
	echo "rxelab: job $(basename "$d") exit=$rc, powering off" > /dev/console
	sync; poweroff -f
fi

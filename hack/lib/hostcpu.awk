# Host CPU by process and thread, for hack/bench-start.sh. Input: the
# output of
#   perf script --show-task-events -F pid,tid,event,trace
# of `perf record -e sched:sched_stat_runtime -a` (the scheduler's account
# of each task's runtime, so every nanosecond of CPU of every task,
# including the ones that exit while recording). Counts the processes
# descended from the pids in roots (space-separated), and n pods. Prints
#   total <CPU seconds per pod>
#   <class> <CPU seconds per pod>     (one line per class, largest first)
# Classes: QEMU's vCPU thread (under TCG its busiest thread but the main
# loop, as every VM here has one vCPU), its main loop, its other threads
# (RCU, I/O workers), then each other process by name: the shim (both its
# `start` and its daemon), containerd, ctr, c8s-verify, crun, etc.
# Records are read in order, since pids are reused on a busy node.
function member(p,   q, d) {
	if (p in state) return state[p]
	q = p
	for (d = 0; d < 64; d++) {
		if (q in isroot) return state[p] = 1
		if (!(q in synpar)) break
		q = synpar[q]
	}
	return state[p] = 0
}
BEGIN { split(roots, r, " "); for (i in r) isroot[r[i]] = 1 }
$2 ~ /^PERF_RECORD_FORK/ {
	s = $2; gsub(/[^0-9]+/, " ", s); split(s, a, " ") # child pid, tid; parent pid, tid
	tgid[a[2]] = a[1]
	if (a[1] == a[3]) next # a new thread
	if ($1 == "0/0") { synpar[a[1]] = a[3]; next } # a task perf found at its start
	state[a[1]] = member(a[3]); pname[a[1]] = pname[a[3]]
	next
}
$2 ~ /^PERF_RECORD_COMM/ {
	line = $0; sub(/.*PERF_RECORD_COMM(: | exec: )/, "", line)
	m = match(line, /:[0-9]+\/[0-9]+$/); split(substr(line, m + 1), b, "/")
	if (b[1] == b[2] || $0 ~ / exec: /) pname[b[1]] = substr(line, 1, m - 1)
	next
}
$2 == "sched:sched_stat_runtime:" {
	# The task charged is the event's pid= (the record's own pid/tid can
	# be the task that was switched to).
	line = $0; sub(/.* comm=/, "", line)
	rt = line; sub(/.* runtime=/, "", rt); sub(/ .*/, "", rt)
	tid = line; sub(/.* pid=/, "", tid); sub(/ .*/, "", tid)
	if (tid in tgid) pid = tgid[tid]; else { split($1, id, "/"); pid = id[1] }
	if (!member(pid)) next
	pn = pname[pid]
	if (pn ~ /^perf/) next # the recorder itself
	if (pn ~ /^qemu-system/) {
		if (tid == pid) c = "qemu main loop"
		else { qt[pid, tid] += rt; next }
	} else if (pn ~ /^containerd-shim/) c = "shim"
	else c = pn
	cpu[c] += rt
}
END {
	for (k in qt) { split(k, pt, SUBSEP); if (qt[k] > top[pt[1]]) top[pt[1]] = qt[k] }
	for (k in qt) { split(k, pt, SUBSEP); cpu[qt[k] == top[pt[1]] ? "qemu vCPU" : "qemu other threads"] += qt[k] }
	nc = 0
	for (c in cpu) { total += cpu[c]; name[++nc] = c }
	for (i = 2; i <= nc; i++) # insertion sort, largest first (mawk has no asort)
		for (j = i; j > 1 && cpu[name[j]] > cpu[name[j - 1]]; j--) { t = name[j]; name[j] = name[j - 1]; name[j - 1] = t }
	printf "total %.3f\n", total / 1e9 / n
	for (i = 1; i <= nc; i++) printf "%s %.3f\n", name[i], cpu[name[i]] / 1e9 / n
}

/*
 * Stages 0 and 3: every process shares one activity SimpleQueue and one result SimpleQueue.
 *
 * Stage 0 is unpatched apache-airflow-core 3.3.2; stage 3 is base + patches 1-3 (`python -m tools stage
 * --line 3.3 --stage 3`), which adds a read of the results before each put (drain-before-put),
 * pid-tagged results with a "took it" message, a slot per dispatch, and an end() that reads results
 * while it joins. Included by stage0.pml and stage3.pml, which set STAGE.
 *
 * SimpleQueue.get() is "with self._rlock: self._reader.recv_bytes()" and put() is "with self._wlock:
 * self._writer.send_bytes(...)": both block until the whole frame is through the pipe, under a lock
 * every worker shares (the activity queue's read lock, the result queue's write lock). A worker killed
 * while it holds one never releases it. unread_messages is a multiprocessing.Value: its lock too.
 *
 * Comments tagged @op name the real operation a step stands for (function: "a quote of the line").
 */

#ifndef N
#define N 2
#endif
#ifndef K
#define K 3
#endif
#ifndef W
#define W 2
#endif
#ifndef R
#define R 2
#endif
#ifndef RUNF
#define RUNF 1
#endif
#define TOOKF 1
#define PILL 1
#ifndef KILLS
#define KILLS 0
#endif
#ifndef CHECK_END
#define CHECK_END 1    /* 0: check dispatch only; the executor stops after the scheduler's loop */
#endif

#include "pipes.pml"

#define ACT 0
#define RES 1

byte plen[2];
byte poff[2];
byte act_rlock;        /* activity_queue._rlock: holder slot + 1 */
byte res_wlock;        /* result_queue._wlock */
byte ulock;            /* _unread_messages' lock */
byte res_open;         /* slot + 1 of the writer of the unfinished frame in the result pipe */
short unread;          /* _unread_messages.value (a c_uint: only "is it zero" is ever asked) */
chan actfr = [K + N] of { byte };                /* keys of the frames in the activity pipe; 0 = None */
chan resfr = [3 * K] of { byte, byte, byte };    /* (key, state, writer slot) of the result frames */

bool inuse[N];
bool alive[N];
byte gen[N];
byte wpid[N];
byte phase[N];
byte wkey[N];          /* stage 3: self._worker_tasks[pid] */

byte dcount[K + 1];    /* stage 3: self._dispatch_counts */
byte outcome[K + 1];
byte ranby[K + 1];
byte kills;

#define SLOTS_USED ((inuse[0] -> 1 : 0) + (N > 1 && inuse[1] -> 1 : 0) + (N > 2 && inuse[2] -> 1 : 0))
#define REAPABLE(i) (N > i && inuse[i] && !alive[i])
#define SOMEDEAD (REAPABLE(0) || REAPABLE(1) || REAPABLE(2))
#define ALLENDED ((outcome[1] != NONE) && (K < 2 || outcome[2] != NONE) && (K < 3 || outcome[3] != NONE) \
                  && (K < 4 || outcome[4] != NONE) && (K < 5 || outcome[5] != NONE) \
                  && (K < 6 || outcome[6] != NONE) && (K < 7 || outcome[7] != NONE))

inline rput(w, k, st, size) {  /* @wait worker: result_queue.put() "with self._wlock": the shared write lock */
    /* output.put((...)): "with self._wlock: self._writer.send_bytes(obj)" */
    atomic { res_wlock == 0 -> res_wlock = w + 1 };  /* @op worker: result_queue.put() takes the shared write lock */
    rem = size;
    d_step {  /* @wait worker: result_queue.put() "send_bytes": the result pipe is full */
        WRITABLE(RES) -> assert(res_open == 0); res_open = w + 1; resfr!k, st, w; pipe_put(RES, rem, n)
    };  /* @op worker: result_queue.put() "send_bytes" writes */
    do  /* @wait worker: result_queue.put() "send_bytes": the result pipe is full */
    :: d_step { rem == 0 -> res_open = 0; res_wlock = 0 }; break  /* @op worker: result_queue.put() done, write lock released */
    :: d_step { rem > 0 && WRITABLE(RES) -> pipe_put(RES, rem, n) }  /* @op worker: result_queue.put() "send_bytes" writes another page */
    od
}

proctype Worker(byte w; byte g) {
    byte k, st, need, rem, n;
    {
#if CHECK_END == 0
end_idle:  /* without end(), a worker waiting for a workload is where it should be */
#endif
        do  /* @wait worker: _run_worker "input.get()": the shared read lock (idle) */
        :: atomic { act_rlock == 0 -> act_rlock = w + 1 };  /* @op worker: _run_worker "input.get()" takes the shared read lock (idle) */
#if CHECK_END == 0
end_read:
#endif
           d_step {  /* @wait worker: _run_worker "input.get()" recv_bytes(): the activity pipe is empty */
               plen[ACT] > 0 -> actfr?<k>; need = (k == 0 -> PILL : W); phase[w] = PH_READ;
               pipe_take(ACT, need, n)
           };  /* @op worker: "input.get()" recv_bytes() reads a workload */
           do  /* @wait worker: "input.get()" recv_bytes(): the rest of the frame */
           :: d_step { need == 0 -> actfr?k; act_rlock = 0; phase[w] = (k == 0 -> PH_IDLE : PH_RUN) }; break  /* @op worker: "input.get()" returns, read lock released */
           :: d_step { need > 0 && plen[ACT] > 0 -> pipe_take(ACT, need, n) }  /* @op worker: "input.get()" reads more of the frame */
           od;
           if
           :: k == 0 -> break  /* "if workload is None: return" */
           :: else
           fi;
           atomic { ulock == 0 -> ulock = w + 1; phase[w] = PH_LOCKS };  /* @op worker: "with unread_messages:" */
           d_step { unread--; ulock = 0; phase[w] = PH_RUN };  /* @op worker: "unread_messages.value -= 1" */
#if STAGE == 3
           rput(w, k, ST_TOOK, TOOKF);  /* @op worker: "output.put((workload.key, None, None, pid))" */
#endif
           rput(w, k, ST_RUNNING, RUNF);  /* @op worker: "output.put((workload.key, workload.running_state, ...))" */
           atomic { ranby[k] = _pid; phase[w] = PH_WRITE };  /* @op worker: "BaseExecutor.run_workload(workload, ...)" runs the task */
           rput(w, k, ST_DONE, R);  /* @op worker: "output.put((workload.key, workload.success_state, ...))" */
           phase[w] = PH_IDLE
        od;
        atomic { alive[w] = false }  /* @op worker: exits on the None pill */
    } unless { gen[w] != g || !alive[w] }  /* @op worker: killed: the process is gone */
}

/* SIGKILL of any worker at any step (idle, mid-read, mid-task, mid-frame), up to KILLS times; the
   killed worker's `unless` ends it at once, whatever it held stays held. */
#define KILLOPT(i) :: d_step { N > i && kills < KILLS && alive[i] && KILLABLE(i) -> \
                       kills++; alive[i] = false; printf("SIGKILL pid %d\n", wpid[i]) }
active proctype Killer() {
end:
    do
    KILLOPT(0)  /* @op SIGKILL */
    KILLOPT(1)  /* @op SIGKILL */
    KILLOPT(2)  /* @op SIGKILL */
    od
}

inline spawn(i) {
    /* _spawn_worker: "p = multiprocessing.Process(target=_run_worker, ...)"; "p.start()" */
    wkey[i] = 0; phase[i] = PH_IDLE; inuse[i] = true; alive[i] = true; gen[i] = gen[i] + 1;
    wpid[i] = run Worker(i, gen[i])
}

inline end_dispatch(k, how) {
    dcount[k] = dcount[k] - 1;
    if
    :: dcount[k] == 0 -> assert(outcome[k] == NONE); outcome[k] = how
    :: else
    fi
}

inline handle_result(k, st, w) {
#if STAGE == 3
    /* _read_results: "if self._dispatch_counts.get(key, 0) <= 0: ... continue" */
    if
    :: dcount[k] == 0 -> skip
    :: dcount[k] > 0 && st == ST_TOOK -> wkey[w] = k  /* "self._worker_tasks[pid] = key" */
    :: dcount[k] > 0 && st == ST_RUNNING -> skip
    :: dcount[k] > 0 && st == ST_DONE -> wkey[w] = 0; assert(ranby[k] == wpid[w]); end_dispatch(k, SUCCESS)
    fi
#else
    /* _read_results: "self.change_state(key, state)" */
    if
    :: st == ST_DONE -> assert(outcome[k] == NONE && ranby[k] == wpid[w]); outcome[k] = SUCCESS
    :: else
    fi
#endif
}

inline read_results() {
    /* _read_results: "while not self.result_queue.empty(): ... self.result_queue.get()" */
    do
    :: plen[RES] == 0 -> break  /* "self.result_queue.empty()" */
    :: d_step { plen[RES] > 0 -> resfr?<k, st, w>; need = (st == ST_DONE -> R : (st == ST_RUNNING -> RUNF : TOOKF)) };
       do  /* @wait executor: _read_results "self.result_queue.get()": the rest of a frame */
       :: d_step { need == 0 -> resfr?k, st, w; handle_result(k, st, w) }; break  /* @op executor: _read_results "self.result_queue.get()" returns a result */
       :: d_step { need > 0 && plen[RES] > 0 -> pipe_take(RES, need, n) }  /* @op executor: _read_results "self.result_queue.get()" reads (blocks until the whole frame is there) */
       od
    od
}

inline fail_lost(w) {
    /* stage 3 _check_workers: "key := self._worker_tasks.pop(pid, None)" */
    k = wkey[w]; wkey[w] = 0;
    if
    :: k != 0 && dcount[k] > 0 -> end_dispatch(k, FAILED)
    :: else
    fi
}

inline check_workers() {
#if STAGE == 3
    read_results();  /* _check_workers: "self._read_results()" */
#endif
    /* _check_workers: "if not proc.is_alive(): to_remove.add(pid)" */
    atomic {
        reaped = 0;
        for (i : 0 .. N - 1) {
            if
            :: inuse[i] && !alive[i] -> inuse[i] = false; reaped = reaped | (1 << i)
            :: else
            fi
        }
    };  /* @op executor: _check_workers reaps dead workers */
#if STAGE == 3
    if
    :: reaped != 0 ->
       read_results();  /* "self._read_results()" before failing what a dead worker held */
       atomic {
           for (i : 0 .. N - 1) {
               if
               :: (reaped >> i) & 1 -> fail_lost(i)
               :: else
               fi
           }
       }  /* "if (key := self._worker_tasks.pop(pid, None)) is not None: self._finish_dispatch(key, ...FAILED)" */
    :: else
    fi;
#endif
    atomic { ulock == 0 -> ulock = N + 1 };  /* @op executor: _check_workers "with self._unread_messages:" */
    d_step {
        ulock = 0;
        spawn_needed = (unread != 0 && plen[ACT] > 0 && SLOTS_USED < N)
    };
    if
    :: spawn_needed ->
       atomic {
           for (i : 0 .. N - 1) {
               if
               :: !inuse[i] -> spawn(i)
               :: else
               fi
           }
       }  /* @op executor: _check_workers "self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))" */
    :: else
    fi
}

inline put(k, size) {
    /* activity_queue.put(workload): "self._writer.send_bytes(obj)", blocking */
    rem = size;
    do  /* @wait executor: "self.activity_queue.put(...)": the activity pipe is full */
    :: d_step { rem > 0 && WRITABLE(ACT) -> if :: rem == size -> actfr!k :: else fi; pipe_put(ACT, rem, n) }  /* @op executor: "self.activity_queue.put(...)" writes */
    :: rem == 0 -> break
    od
}

#define SYNC_READY (plen[RES] > 0 || SOMEDEAD)

active proctype Executor() {
    byte w, k, st, i, j, n, rem, need, reaped;
    bool spawn_needed;
    atomic {
        for (i : 0 .. N - 1) { spawn(i) }
    };  /* @op executor: start() "self._spawn_workers_with_gc_freeze(self.parallelism)" */
    /* _process_workloads: "for workload in workload_list:" */
    for (j : 1 .. K) {
#if STAGE == 3
        read_results();  /* @op executor: _process_workloads "self._read_results()" before the put */
#endif
        put(j, W);  /* @op executor: _process_workloads "self.activity_queue.put(workload)" */
#if STAGE == 3
        dcount[j] = 1;  /* "self._dispatch_counts[key] = self._dispatch_counts.get(key, 0) + 1" */
#endif
    }
    atomic { ulock == 0 -> ulock = N + 1 };  /* @op executor: _process_workloads "with self._unread_messages:" */
    d_step { unread = unread + K; ulock = 0 };
    check_workers();
    /* the scheduler: sync() every heartbeat until every key has ended */
    do  /* @wait executor: sync(): a result or a dead worker */
    :: ALLENDED -> break
    :: !ALLENDED && SYNC_READY -> read_results(); check_workers()  /* @op executor: sync() */
    :: timeout -> break  /* nothing can move any more: the scheduler stops the executor */
    od;
#if CHECK_END == 0
    assert(ALLENDED)  /* @op executor: the scheduler has waited for every workload it dispatched */
#else
    /* end(): "for proc in self.workers.values(): if proc.is_alive(): self.activity_queue.put(None)" */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] && alive[i] -> put(0, PILL)  /* @op executor: end() "self.activity_queue.put(None)" */
        :: else
        fi
    }
    for (i : 0 .. N - 1) {
#if STAGE == 3
        /* "while proc.is_alive(): self._read_results(); proc.join(timeout=0.05)" */
        do  /* @wait executor: end() "while proc.is_alive(): self._read_results(); proc.join(timeout=0.05)" */
        :: !inuse[i] || !alive[i] -> break
        :: inuse[i] && alive[i] && plen[RES] > 0 -> read_results()  /* @op executor: end() "self._read_results()" while joining */
        od
#else
        (!inuse[i] || !alive[i])  /* @wait executor: end() "proc.join()": a worker that never exits */
#endif
    }
    read_results();  /* @op executor: end() "self._read_results()" */
end_done:
    /* every dispatched workload ended exactly once (reporting asserts "once") */
    assert(ALLENDED)  /* @op executor: end() has returned */
#endif
}

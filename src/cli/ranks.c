/* --gpus N: one process a GPU (docs/multigpu.md). Rank 0 is the process the user started; it
 * forks ranks 1 .. N-1 before any GPU work (a CUDA context does not survive fork), hands each
 * the communicator's id through a pipe, and watches them. Every rank runs the same command on
 * the same input, so their collectives pair up; only rank 0 writes output. No rank is left
 * waiting in a collective for a peer that is gone:
 * - a rank that fails, or ends without saying it finished (a byte on its pipe back), makes
 *   rank 0 name it and end every rank;
 * - rank 0 failing ends the others (SIGTERM), and a rank whose rank 0 is gone is ended by the
 *   kernel (PR_SET_PDEATHSIG). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli/cli.h"
#include "core/core.h"
#include "kernels/ranks.h"
#include "model/diag.h"

#define MAX_RANKS 64

static int g_world, g_rank;
static pid_t g_pid[MAX_RANKS];
static const char *g_cmd = "";
static int g_done[MAX_RANKS];   /* rank 0: each rank's pipe back; rank r: its write end */
static pthread_t g_watch;
static int g_watching;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* g_pid, g_stopping */
static int g_stopping;          /* rank 0 ends the others itself: the watcher only reaps */

int cli_rank(void) { return g_rank; }

static void stop_all(void)
{
    pthread_mutex_lock(&g_lock);
    g_stopping = 1;
    for (int i = 1; i < g_world; i++)
        if (g_pid[i] > 0)
            kill(g_pid[i], SIGTERM);
    pthread_mutex_unlock(&g_lock);
}

/* Rank 0's watcher: reaps the other ranks; one that failed, or ended without finishing, ends
 * the run. */
static void *watch(void *arg)
{
    (void)arg;
    int left = g_world - 1;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        int r = 0;
        pthread_mutex_lock(&g_lock);
        for (int i = 1; i < g_world; i++)
            if (g_pid[i] == p)
                r = i;
        if (r)
            g_pid[r] = 0;
        int stopping = g_stopping;
        pthread_mutex_unlock(&g_lock);
        if (!r)
            continue;
        left--;
        if (stopping)
            continue;
        char said = 0;
        int finished = read(g_done[r], &said, 1) == 1 && said == 'F';
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !finished) {
            if (WIFSIGNALED(st))
                fprintf(stderr, "dsv4 %s: rank %d was ended by signal %d; stopping every rank\n", g_cmd, r, WTERMSIG(st));
            else if (WEXITSTATUS(st) != 0)
                fprintf(stderr, "dsv4 %s: rank %d failed (exit status %d); stopping every rank\n", g_cmd, r,
                        WEXITSTATUS(st));
            else
                fprintf(stderr, "dsv4 %s: rank %d ended before finishing; stopping every rank\n", g_cmd, r);
            stop_all();
            fflush(stdout);
            fflush(stderr);
            _exit(1);
        }
    }
    return NULL;
}

/* All n bytes through fd, written (out) or read; -1 when the pipe broke or closed first. */
static int pipe_all(int fd, void *p, size_t n, int out)
{
    char *b = p;
    while (n) {
        ssize_t k = out ? write(fd, b, n) : read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k, n -= (size_t)k;
    }
    return 0;
}

/* The GPUs CUDA sees, counted in a child that exits: a CUDA driver started in this process
 * would not survive the forks that follow. -1 when it cannot be counted. */
static int count_gpus(void)
{
    int fd[2], n = -1;
    if (pipe(fd))
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        close(fd[0]);
        int k = dsv4_ranks_gpus();
        _exit(pipe_all(fd[1], &k, sizeof k, 1) ? 1 : 0);
    }
    close(fd[1]);
    if (p > 0 && pipe_all(fd[0], &n, sizeof n, 0))
        n = -1;
    close(fd[0]);
    if (p > 0)
        waitpid(p, NULL, 0);
    return n;
}

int cli_ranks_start(cli_model_opts *o, const char *cmd)
{
    int N = o->gpus;
    g_cmd = cmd;
    if (!N)
        return 0;
    if (!o->load.device || strcmp(o->load.device, "cuda")) {
        fprintf(stderr, "dsv4 %s: --gpus runs on the CUDA backend: add --device cuda\n", cmd);
        return 1;
    }
    if (N < 1 || N > MAX_RANKS) {
        fprintf(stderr, "dsv4 %s: --gpus takes 1 to %d\n", cmd, MAX_RANKS);
        return 1;
    }
    /* tests: every rank on GPU 0 (NCCL refuses two ranks on one GPU; the refusal is checked) */
    const char *one = getenv("DSV4_RANKS_ONE_GPU");
    int one_gpu = one && *one == '1', have = one_gpu ? N : count_gpus();
    if (have >= 0 && N > have) {
        fprintf(stderr, "dsv4 %s: --gpus %d: this machine has %d GPU%s\n", cmd, N, have, have == 1 ? "" : "s");
        return 1;
    }
    int fds[MAX_RANKS][2], back[MAX_RANKS][2];
    for (int r = 1; r < N; r++)
        if (pipe(fds[r]) || pipe(back[r])) {
            fprintf(stderr, "dsv4 %s: --gpus: pipe: %s\n", cmd, strerror(errno));
            return 1;
        }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    g_world = N;
    g_rank = 0;
    for (int r = 1; r < N; r++) {
        pid_t p = fork();
        if (p < 0) {
            fprintf(stderr, "dsv4 %s: --gpus: fork: %s\n", cmd, strerror(errno));
            for (int i = 1; i < r; i++)
                kill(g_pid[i], SIGTERM);
            return 1;
        }
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent)
                _exit(1);
            g_rank = r;
            int dn = open("/dev/null", O_WRONLY);
            if (dn >= 0) {
                dup2(dn, STDOUT_FILENO);
                close(dn);
            }
            break;
        }
        g_pid[r] = p;
    }
    for (int r = 1; r < N; r++) {
        if (g_rank == 0 || r != g_rank)
            close(fds[r][0]);
        if (g_rank != 0)
            close(fds[r][1]);
        if (g_rank == 0)
            g_done[r] = back[r][0];
        else
            close(back[r][0]);
        if (g_rank == r)
            g_done[r] = back[r][1];
        else
            close(back[r][1]);
    }
    if (g_rank == 0 && N > 1) {
        if (pthread_create(&g_watch, NULL, watch, NULL)) {
            fprintf(stderr, "dsv4 %s: --gpus: cannot start the rank watcher\n", cmd);
            return 1;
        }
        g_watching = 1;
    }
    o->load.progress = g_rank == 0;
    /* NVLink multicast stays off unless asked for: on a shared host it can take the GPUs out of
     * service for everyone */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    dsv4_err err = {0};
    unsigned char id[DSV4_RANKS_ID_BYTES];
    int rc = dsv4_ranks_prepare(N, g_rank, one_gpu ? 0 : g_rank, &err);
    if (g_rank == 0) {
        if (!rc)
            rc = dsv4_ranks_id(id, &err);
        /* a rank already gone must not end rank 0 by SIGPIPE: the watcher names it */
        void (*was)(int) = signal(SIGPIPE, SIG_IGN);
        for (int r = 1; r < N; r++) {
            /* a failed rank 0 closes the pipes unwritten: the others then stop at once */
            if (!rc && pipe_all(fds[r][1], id, sizeof id, 1))
                rc = dsv4_fail(&err, DSV4_E_IO, "--gpus: handing rank %d its id: %s", r, strerror(errno));
            close(fds[r][1]);
        }
        signal(SIGPIPE, was);
    } else {
        int got = pipe_all(fds[g_rank][0], id, sizeof id, 0);
        close(fds[g_rank][0]);
        if (got) {
            fprintf(stderr, "dsv4 %s: rank %d: rank 0 stopped before handing over the communicator\n", cmd, g_rank);
            return 1;
        }
    }
    if (!rc)
        rc = dsv4_ranks_join(N, g_rank, id, &err);
    if (rc) {
        fprintf(stderr, "dsv4 %s: rank %d of %d: %s\n", cmd, g_rank, N, err.msg);
        return 1;
    }
    return 0;
}

int cli_ranks_check(const dsv4_model *m, const char *cmd)
{
    if (!g_world)
        return 0;
    uint64_t mine = dsv4_model_fingerprint(m), all[MAX_RANKS];
    dsv4_err err = {0};
    if (dsv4_ranks_allgather(&mine, sizeof mine, all, &err)) {
        fprintf(stderr, "dsv4 %s: rank %d: comparing the checkpoints: %s\n", cmd, g_rank, err.msg);
        return 1;
    }
    for (int r = 1; r < g_world; r++)
        if (all[r] != all[0]) {
            fprintf(stderr,
                    "dsv4 %s: rank %d loaded a different model than rank 0 (fingerprint %016" PRIx64 ", rank 0 %016" PRIx64
                    "): every rank must load the same checkpoint with the same options\n",
                    cmd, r, all[r], all[0]);
            return 1;
        }
    return 0;
}

int cli_ranks_finish(int rc)
{
    if (!g_world)
        return rc;
    fflush(stdout);
    if (g_rank != 0) {
        if (!rc)
            pipe_all(g_done[g_rank], (char[]){'F'}, 1, 1);
        return rc;
    }
    if (rc) /* the others may wait in a collective rank 0 will not join */
        stop_all();
    if (g_watching)
        pthread_join(g_watch, NULL);
    return rc;
}

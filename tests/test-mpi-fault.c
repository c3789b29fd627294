/* SPDX-License-Identifier: MIT */
/*
 * A process that dies in the middle of a CP attention over MPI.
 *
 * Run without arguments but the mpirun command, it is the driver: it starts
 * itself on 4 processes with mpirun, gives the job TIMEOUT_MS + a margin,
 * and passes when mpirun came back in time and every surviving rank
 * reported an error from cp_attn_forward (CP_ERROR_TIMEOUT or
 * CP_ERROR_COMM) within the group's timeout - or, where Open MPI ends the
 * job itself when a process dies, when mpirun came back in time saying so.
 * Started by mpirun (OMPI_COMM_WORLD_SIZE set), it is a rank: rank 2 calls
 * _exit(0) at its third transport call of the forward (a ring shift), the
 * others report what cp_attn_forward returned and how long it took.
 *
 * argv (driver): <mpirun> [NAME=VALUE]...  (the environment of the ranks)
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mpi.h>

#include <infinicp/mpi.h>

#include "faulty.h"
#include "testutil.h"

enum { P = 4, S = 32, H = 4, HKV = 2, D = 8, VICTIM = 2 };

#define TIMEOUT_MS 3000
/* mpirun's own start and end, and a slow (sanitized) build */
#define MARGIN_MS 60000

/* ---- a rank ------------------------------------------------------------- */

static int rank_main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    static faulty_plan plan = { .rank = VICTIM, .after = 2, .how = FAULTY_EXIT_PROCESS };
    cp_comm *comm = NULL;
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_attn_plan *p = NULL;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = TIMEOUT_MS;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 1;
    d.seq_len = S;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.mode = CP_MODE_P2P;
    const size_t n = (size_t)S / (size_t)size;
    float *q = calloc(n * H * D, sizeof *q), *k = calloc(n * HKV * D, sizeof *k);
    float *v = calloc(n * HKV * D, sizeof *v), *o = calloc(n * H * D, sizeof *o), *lse = calloc(n * H, sizeof *lse);
    cp_status s = q && k && v && o && lse ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
    if (s == CP_SUCCESS)
        s = cp_comm_create_mpi_comm(MPI_COMM_WORLD, &comm);
    if (s == CP_SUCCESS)
        s = faulty_wrap(&comm, &plan);
    if (s == CP_SUCCESS)
        s = cp_context_create(&cc, &ctx);
    if (s == CP_SUCCESS)
        s = cp_group_create(ctx, comm, &gc, &g);
    if (s == CP_SUCCESS)
        s = cp_attn_plan_create(g, &d, &p);
    if (s != CP_SUCCESS) {
        printf("rank %d: SETUP-FAILED %s\n", rank, cp_last_error());
        fflush(stdout);
        _exit(1);
    }
    if (rank == VICTIM)
        faulty_arm(&plan);
    double t0 = now_ms();
    s = cp_attn_forward(p, q, k, v, o, lse, NULL, 0);
    double ms = now_ms() - t0;
    /* the survivors' verdict, one line each, for the driver */
    printf("rank %d: forward %s after %.0f ms (timeout %d ms): %s\n", rank, cp_status_string(s), ms, TIMEOUT_MS,
           s == CP_SUCCESS ? "-" : cp_last_error());
    fflush(stdout);
    /* everything this rank holds is freed; the communicator is broken */
    cp_attn_plan_destroy(p);
    cp_group_destroy(g);
    cp_context_destroy(ctx);
    cp_comm_destroy(comm);
    free(q), free(k), free(v), free(o), free(lse);
    /* MPI_Finalize waits for every process, and one is gone for good */
    _exit(s == CP_ERROR_TIMEOUT || s == CP_ERROR_COMM ? 0 : 1);
}

/* ---- the driver --------------------------------------------------------- */

/* Run mpirun on this program (with --enable-recovery when asked); collect
 * what the job prints in out. Returns mpirun's wait status, or -1 when it
 * did not end within the time (the job is killed then). */
static int run_job(int argc, char **argv, int recovery, char *out, size_t cap, double *ms)
{
    int fds[2];
    if (pipe(fds) != 0)
        return perror("pipe"), -1;
    pid_t pid = fork();
    if (pid < 0)
        return perror("fork"), -1;
    if (pid == 0) {
        setpgid(0, 0); /* the job is killed whole if it hangs */
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        for (int i = 2; i < argc; i++)
            putenv(argv[i]);
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        char np[8];
        snprintf(np, sizeof np, "%d", P);
        if (recovery)
            execl(argv[1], argv[1], "--allow-run-as-root", "--oversubscribe", "--enable-recovery", "-np", np, self,
                  (char *)NULL);
        else
            execl(argv[1], argv[1], "--allow-run-as-root", "--oversubscribe", "-np", np, self, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    const double t0 = now_ms();
    size_t len = 0;
    int status = -1;
    for (;;) {
        struct pollfd pf = { fds[0], POLLIN, 0 };
        double left = TIMEOUT_MS + MARGIN_MS - (now_ms() - t0);
        if (left <= 0) {
            kill(-pid, SIGKILL);
            waitpid(pid, NULL, 0);
            break;
        }
        if (poll(&pf, 1, (int)left) > 0) {
            ssize_t r = read(fds[0], out + len, cap - 1 - len);
            if (r > 0) {
                len += (size_t)r;
                continue;
            }
            /* end of output: every process of the job is gone */
            waitpid(pid, &status, 0);
            break;
        }
    }
    *ms = now_ms() - t0;
    out[len] = '\0';
    close(fds[0]);
    return status;
}

/* Did every rank but the victim report a timeout or comm error in time? */
static int survivors_failed_in_time(const char *out)
{
    int good = 0;
    for (int r = 0; r < P; r++) {
        char head[32];
        snprintf(head, sizeof head, "rank %d: forward ", r);
        const char *line = strstr(out, head);
        if (r == VICTIM) {
            if (line)
                return printf("rank %d, which died, reported: %.200s\n", r, line), 0;
            continue;
        }
        double ms = 0;
        const char *what = line ? line + strlen(head) : NULL, *after = what ? strstr(what, " after ") : NULL;
        if (!after || sscanf(after, " after %lf ms", &ms) != 1)
            return printf("rank %d reported nothing\n", r), 0;
        const int wlen = (int)(after - what);
        if (strncmp(what, "timeout ", 8) && strncmp(what, "communication error ", 20))
            return printf("rank %d: forward returned \"%.*s\", not a timeout or comm error\n", r, wlen, what), 0;
        if (ms > TIMEOUT_MS + 2000)
            return printf("rank %d returned after %.0f ms, beyond the %d ms timeout\n", r, ms, TIMEOUT_MS), 0;
        good++;
    }
    return good == P - 1;
}

static int driver(int argc, char **argv)
{
    static char out[1 << 16];
    double ms = 0;
    int failed = 0;

    /* Open MPI's default: mpirun ends the whole job when a process exits
     * without MPI_Finalize. The survivors may be killed before their
     * timeout; what matters is that nothing hangs. */
    int st = run_job(argc, argv, 0, out, sizeof out, &ms);
    printf("== default: %s after %.0f ms\n%s", st < 0 ? "mpirun killed" : "mpirun returned", ms, out);
    if (st < 0) {
        printf("FAIL: the job hung past %d ms\n", TIMEOUT_MS + MARGIN_MS);
        failed = 1;
    } else if (!(WIFEXITED(st) && WEXITSTATUS(st) != 0) && !survivors_failed_in_time(out)) {
        printf("FAIL: the job neither ended with an error nor did the survivors report one\n");
        failed = 1;
    }

    /* With --enable-recovery the survivors keep running: each must see the
     * dead peer as an error within the group's timeout. */
    st = run_job(argc, argv, 1, out, sizeof out, &ms);
    printf("== --enable-recovery: %s after %.0f ms\n%s", st < 0 ? "mpirun killed" : "mpirun returned", ms, out);
    if (st < 0 || !survivors_failed_in_time(out)) {
        printf("FAIL: with recovery enabled the survivors did not all fail in time\n");
        failed = 1;
    }
    return failed;
}

int main(int argc, char **argv)
{
    if (getenv("OMPI_COMM_WORLD_SIZE"))
        return rank_main(argc, argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s <mpirun> [NAME=VALUE]...\n", argv[0]);
        return 2;
    }
    return driver(argc, argv);
}

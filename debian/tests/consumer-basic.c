/* SPDX-License-Identifier: MIT */
/*
 * The smallest program a user of libinfinicp writes, built against the
 * installed packages: version, status strings, a CPU context, an error with
 * its message, and, when libinfinicp1-cuda is installed, that the CUDA module
 * is found in the installed module folder (opening a device may still fail
 * on a machine without a GPU, but not with CP_ERROR_NOT_FOUND).
 */
#include <stdio.h>
#include <string.h>

#include <infinicp/infinicp.h>

static int failures;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok    " : "not ok", what);
    if (!ok)
        failures++;
}

int main(int argc, char **argv)
{
    int cuda_installed = argc > 1 && !strcmp(argv[1], "--cuda-module-installed");

    unsigned v = cp_version();
    printf("libinfinicp %u.%u.%u, header %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100,
           CP_VERSION_MAJOR, CP_VERSION_MINOR, CP_VERSION_PATCH);
    check(v == CP_VERSION, "cp_version() matches the installed header");
    check(!strcmp(cp_status_string(CP_SUCCESS), cp_status_string(CP_SUCCESS)) &&
              strlen(cp_status_string(CP_ERROR_INVALID_ARGUMENT)) > 0 &&
              strcmp(cp_status_string(CP_SUCCESS), cp_status_string(CP_ERROR_INVALID_ARGUMENT)),
          "cp_status_string() gives distinct, non-empty texts");

    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = 1;
    cp_context *ctx = NULL;
    cp_status s = cp_context_create(&cfg, &ctx);
    check(s == CP_SUCCESS && ctx, "cp_context_create(CPU)");
    if (s != CP_SUCCESS)
        printf("     %s: %s\n", cp_status_string(s), cp_last_error());
    check(cp_context_synchronize(ctx) == CP_SUCCESS, "cp_context_synchronize");
    cp_context_destroy(ctx);
    cp_context_destroy(NULL);

    cfg.num_threads = -1;
    ctx = (cp_context *)&cfg; /* must be reset to NULL on failure */
    s = cp_context_create(&cfg, &ctx);
    check(s == CP_ERROR_INVALID_ARGUMENT && ctx == NULL &&
              strstr(cp_last_error(), "cp_context_create") && strstr(cp_last_error(), "num_threads"),
          "a bad argument gives CP_ERROR_INVALID_ARGUMENT and a message naming it");
    printf("     message: %s\n", cp_last_error());

    cp_context_config gpu = CP_CONTEXT_CONFIG_INIT;
    gpu.device = CP_DEVICE_CUDA;
    ctx = NULL;
    s = cp_context_create(&gpu, &ctx);
    printf("     CUDA context: %s%s%s\n", cp_status_string(s), s ? ": " : "", s ? cp_last_error() : "");
    /* With the module installed, a failure may still be NOT_FOUND for a
     * missing driver or GPU, but never for the module itself. */
    if (cuda_installed)
        check(s == CP_SUCCESS || !strstr(cp_last_error(), "module backend-cuda.so not found"),
              "libinfinicp1-cuda is installed: its module is found and loads");
    else
        check(s == CP_SUCCESS || s == CP_ERROR_NOT_FOUND, "no CUDA module: CP_ERROR_NOT_FOUND");
    cp_context_destroy(ctx);

    printf("consumer-basic: %d check(s) failed\n", failures);
    return failures != 0;
}

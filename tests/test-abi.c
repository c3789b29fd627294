/* SPDX-License-Identifier: MIT */
/*
 * Keeps the ABI and its documentation honest:
 *  - the dynamic symbols the library exports == the version script's list ==
 *    the functions declared in the public headers;
 *  - every exported symbol has a man page man/<symbol>.3 (or an alias page
 *    that points at one with `.so`), the page renders without warnings, and
 *    its SYNOPSIS carries the header's prototype verbatim (whitespace folded);
 *  - every exported symbol is listed in debian/libinfinicp1.symbols;
 *  - the overview page infinicp.7 points at every exported symbol's page.
 *
 *  - every page's EXAMPLE is a whole program: it compiles under
 *    -std=c99 -pedantic -Werror against the public headers, links against the
 *    built library, and runs to exit status 0 (within 120 s) in a fresh
 *    working directory that it leaves empty. An example that includes
 *    <mpi.h> is built with MPICC and run on 2 processes by MPIRUN with the
 *    NAME=VALUE environment; without --mpi such examples are skipped, and
 *    the test says so.
 *
 * argv: <libinfinicp.so> <version script> <include dir> <man dir> <symbols file>
 *       <C compiler> <scratch dir> [--mpi <MPI C compiler> <mpirun> [NAME=VALUE]...]
 */
#include <ctype.h>
#include <dirent.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static const char *lib_path, *map_path, *include_dir, *man_dir, *symbols_path, *cc_cmd, *scratch_dir;
/* How MPI examples are built and started; NULL / 0 in a build without MPI. */
static const char *mpicc_cmd, *mpirun_path;
static char **mpi_env;
static int n_mpi_env;

typedef struct {
    char **v;
    size_t n, cap;
} strlist;

static void sl_add(strlist *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        assert_non_null(l->v);
    }
    l->v[l->n] = strndup(s, len);
    assert_non_null(l->v[l->n]);
    l->n++;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void sl_sort_unique(strlist *l)
{
    qsort(l->v, l->n, sizeof *l->v, cmp_str);
    size_t w = 0;
    for (size_t r = 0; r < l->n; r++) {
        if (w && !strcmp(l->v[w - 1], l->v[r])) {
            free(l->v[r]);
            continue;
        }
        l->v[w++] = l->v[r];
    }
    l->n = w;
}

static void sl_free(strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    fclose(f);
    return buf;
}

/* Collapse runs of white space to one space, drop space after '(' and '*'
 * and before ')' ',' ';', so layout differences do not matter. */
static char *fold_space(const char *s)
{
    char *out = malloc(strlen(s) + 1);
    assert_non_null(out);
    size_t w = 0;
    int pending = 0;
    for (; *s; s++) {
        if (isspace((unsigned char)*s)) {
            pending = w > 0;
            continue;
        }
        if (pending && !strchr("),;", *s) && w && !strchr("(*", out[w - 1]))
            out[w++] = ' ';
        pending = 0;
        out[w++] = *s;
    }
    out[w] = 0;
    return out;
}

/* Remove C comments (block and line) and preprocessor lines. */
static void strip_c(char *s)
{
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            memset(p, ' ', (size_t)(end - p));
            p = end - 1;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                *p++ = ' ';
            if (!*p)
                break;
        } else if (*p == '#' && (p == s || p[-1] == '\n')) {
            /* skip the directive, honouring backslash continuations */
            while (*p && !(*p == '\n' && p[-1] != '\\'))
                *p++ = ' ';
            if (!*p)
                break;
        }
    }
}

/* Public functions: declarations at file scope of the form
 * "<type> cp_name(<args>);" (not typedefs, not static inline). */
static void header_functions(strlist *names, strlist *protos)
{
    DIR *d = opendir(include_dir);
    assert_non_null(d);
    struct dirent *e;
    regex_t re;
    assert_int_equal(regcomp(&re, "^[[:space:]]*([A-Za-z_][A-Za-z0-9_ ]*[ *]+)(cp_[a-z0-9_]+)[[:space:]]*\\(",
                             REG_EXTENDED | REG_NEWLINE), 0);
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h"))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", include_dir, e->d_name);
        char *text = read_file(path);
        assert_non_null(text);
        strip_c(text);
        /* statements end at ';' or '{' at depth 0; examine each */
        const char *p = text;
        regmatch_t m[3];
        while (regexec(&re, p, 3, m, 0) == 0) {
            const char *start = p + m[0].rm_so;
            const char *type = p + m[1].rm_so;
            int is_decl = strncmp(type, "typedef", 7) && strncmp(type, "static", 6) &&
                          strncmp(type, "return", 6);
            /* the declaration runs to the matching ')' followed by ';' */
            const char *q = p + m[0].rm_eo;
            int depth = 1;
            while (*q && depth) {
                if (*q == '(')
                    depth++;
                else if (*q == ')')
                    depth--;
                q++;
            }
            while (*q && isspace((unsigned char)*q))
                q++;
            if (is_decl && *q == ';') {
                sl_add(names, p + m[2].rm_so, (size_t)(m[2].rm_eo - m[2].rm_so));
                char *raw = strndup(start, (size_t)(q + 1 - start));
                char *folded = fold_space(raw);
                sl_add(protos, folded, strlen(folded));
                free(raw);
                free(folded);
            }
            p = *q ? q + 1 : q;
        }
        free(text);
    }
    regfree(&re);
    closedir(d);
}

static void exported_symbols(strlist *names)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only --with-symbol-versions '%s'", lib_path);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char addr[64], kind[8], sym[512];
        if (sscanf(line, "%63s %7s %511s", addr, kind, sym) != 3)
            continue;
        if (!strncmp(sym, "INFINICP_", 9))
            continue; /* a version node's own definition */
        char *at = strchr(sym, '@');
        if (!at)
            fail_msg("exported symbol %s has no version node", sym);
        const char *node = at + (at[1] == '@' ? 2 : 1);
        if (strncmp(node, "INFINICP_", 9))
            fail_msg("exported symbol %s has a version node outside INFINICP_*", sym);
        *at = 0;
        if (strncmp(sym, "cp_", 3))
            fail_msg("exported symbol %s leaks: only cp_* symbols may be exported", sym);
        sl_add(names, sym, strlen(sym));
    }
    assert_int_equal(pclose(f), 0);
}

static void version_script_symbols(strlist *names)
{
    char *text = read_file(map_path);
    assert_non_null(text);
    strip_c(text);
    regex_t re;
    assert_int_equal(regcomp(&re, "(^|[[:space:]])(cp_[a-z0-9_]+)[[:space:]]*;", REG_EXTENDED), 0);
    regmatch_t m[3];
    const char *p = text;
    while (regexec(&re, p, 3, m, 0) == 0) {
        sl_add(names, p + m[2].rm_so, (size_t)(m[2].rm_eo - m[2].rm_so));
        p += m[0].rm_eo;
    }
    regfree(&re);
    free(text);
}

static void assert_same(const char *what_a, strlist *a, const char *what_b, strlist *b)
{
    sl_sort_unique(a);
    sl_sort_unique(b);
    int bad = 0;
    size_t i = 0, j = 0;
    while (i < a->n || j < b->n) {
        int c = i == a->n ? 1 : j == b->n ? -1 : strcmp(a->v[i], b->v[j]);
        if (c < 0) {
            print_error("%s has %s, %s does not\n", what_a, a->v[i], what_b);
            bad++, i++;
        } else if (c > 0) {
            print_error("%s has %s, %s does not\n", what_b, b->v[j], what_a);
            bad++, j++;
        } else {
            i++, j++;
        }
    }
    assert_int_equal(bad, 0);
}

static void test_exports_match_version_script(void **state)
{
    (void)state;
    strlist exp = {0}, map = {0};
    exported_symbols(&exp);
    version_script_symbols(&map);
    assert_true(exp.n > 0);
    assert_same("the library's dynamic symbols", &exp, "the version script", &map);
    sl_free(&exp);
    sl_free(&map);
}

static void test_version_script_matches_headers(void **state)
{
    (void)state;
    strlist map = {0}, hdr = {0}, protos = {0};
    version_script_symbols(&map);
    header_functions(&hdr, &protos);
    assert_true(hdr.n > 0);
    assert_same("the version script", &map, "the public headers", &hdr);
    sl_free(&map);
    sl_free(&hdr);
    sl_free(&protos);
}

static void test_debian_symbols_match(void **state)
{
    (void)state;
    strlist exp = {0}, deb = {0};
    exported_symbols(&exp);
    char *text = read_file(symbols_path);
    assert_non_null(text);
    regex_t re;
    assert_int_equal(regcomp(&re, "^[[:space:]]+(cp_[a-z0-9_]+)@INFINICP_[0-9.]+[[:space:]]",
                             REG_EXTENDED | REG_NEWLINE), 0);
    regmatch_t m[2];
    const char *p = text;
    while (regexec(&re, p, 2, m, 0) == 0) {
        sl_add(&deb, p + m[1].rm_so, (size_t)(m[1].rm_eo - m[1].rm_so));
        p += m[0].rm_eo;
    }
    regfree(&re);
    free(text);
    assert_same("the library's dynamic symbols", &exp, "debian/libinfinicp1.symbols", &deb);
    sl_free(&exp);
    sl_free(&deb);
}

/* Path of the page that documents sym, following one `.so` alias. */
static char *man_page_for(const char *sym, char **alias_text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.3", man_dir, sym);
    char *text = read_file(path);
    if (!text)
        return NULL;
    if (!strncmp(text, ".so ", 4)) {
        char target[512];
        assert_int_equal(sscanf(text + 4, "%511s", target), 1);
        const char *base = strrchr(target, '/');
        snprintf(path, sizeof path, "%s/%s", man_dir, base ? base + 1 : target);
        *alias_text = text;
        struct stat st;
        if (stat(path, &st) != 0) {
            print_error("alias page %s.3 points at %s, which does not exist\n", sym, target);
            return NULL;
        }
    } else {
        free(text);
        *alias_text = NULL;
    }
    return strdup(path);
}

static void test_every_symbol_has_a_man_page(void **state)
{
    (void)state;
    strlist exp = {0}, hdr = {0}, protos = {0};
    exported_symbols(&exp);
    header_functions(&hdr, &protos);
    int bad = 0;
    for (size_t i = 0; i < exp.n; i++) {
        char *alias = NULL;
        char *page = man_page_for(exp.v[i], &alias);
        free(alias);
        if (!page) {
            print_error("%s has no man page %s/%s.3\n", exp.v[i], man_dir, exp.v[i]);
            bad++;
            continue;
        }
        char *text = read_file(page);
        assert_non_null(text);
        char *folded = fold_space(text);
        /* the page must carry the header's prototype */
        for (size_t j = 0; j < hdr.n; j++) {
            if (strcmp(hdr.v[j], exp.v[i]))
                continue;
            if (!strstr(folded, protos.v[j])) {
                print_error("%s: the SYNOPSIS lacks the header's prototype \"%s\"\n", page, protos.v[j]);
                bad++;
            }
        }
        /* and name the function in NAME */
        if (!strstr(text, exp.v[i])) {
            print_error("%s never names %s\n", page, exp.v[i]);
            bad++;
        }
        free(folded);
        free(text);
        free(page);
    }
    assert_int_equal(bad, 0);
    sl_free(&exp);
    sl_free(&hdr);
    sl_free(&protos);
}

/* infinicp(7) is the map of the manual: it must point at every exported
 * function's page, so that a new function cannot go unlisted. */
static void test_overview_page_lists_every_function(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/infinicp.7", man_dir);
    char *text = read_file(path);
    assert_non_null(text);
    strlist exp = {0};
    exported_symbols(&exp);
    int bad = 0;
    for (size_t i = 0; i < exp.n; i++) {
        char ref[256];
        snprintf(ref, sizeof ref, ".BR %s (3)", exp.v[i]);
        if (!strstr(text, ref)) {
            print_error("infinicp.7 does not point at %s(3) (a \"%s\" line in SEE ALSO)\n", exp.v[i], ref);
            bad++;
        }
    }
    free(text);
    sl_free(&exp);
    assert_int_equal(bad, 0);
}

static void test_man_pages_lint_clean(void **state)
{
    (void)state;
    DIR *d = opendir(man_dir);
    assert_non_null(d);
    struct dirent *e;
    int pages = 0, bad = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 3 || e->d_name[len - 2] != '.' || !isdigit((unsigned char)e->d_name[len - 1]))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", man_dir, e->d_name);
        char *text = read_file(path);
        assert_non_null(text);
        int is_alias = !strncmp(text, ".so ", 4);
        free(text);
        if (is_alias)
            continue;
        char cmd[8400];
        /* mandoc prints one line per finding at level warning and above */
        snprintf(cmd, sizeof cmd, "mandoc -T lint -W warning '%s' 2>&1", path);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            print_error("%s", line);
            bad++;
        }
        pclose(f);
        pages++;
    }
    closedir(d);
    assert_true(pages > 0);
    assert_int_equal(bad, 0);
}

/* The text between .EX and .EE after .SH EXAMPLE, with roff escapes undone. */
static char *example_of(const char *page)
{
    const char *sec = strstr(page, "\n.SH EXAMPLE");
    if (!sec)
        return NULL;
    const char *ex = strstr(sec, "\n.EX\n");
    if (!ex)
        return NULL;
    ex += 5;
    const char *ee = strstr(ex, "\n.EE");
    if (!ee)
        return NULL;
    char *out = malloc((size_t)(ee - ex) + 2);
    assert_non_null(out);
    size_t w = 0;
    for (const char *p = ex; p <= ee; p++) {
        if (p[0] == '\\' && p[1] == 'e') {
            out[w++] = '\\';
            p++;
        } else if (p[0] == '\\' && p[1] == '-') {
            out[w++] = '-';
            p++;
        } else if (p[0] == '\\' && p[1] == '&') {
            p++;
        } else if (!strncmp(p, "\\(dq", 4)) {
            out[w++] = '"';
            p += 3;
        } else {
            out[w++] = *p;
        }
    }
    out[w] = 0;
    return out;
}

/* Examples that include <mpi.h> (or <infinicp/mpi.h>) are MPI programs. */
static int needs_mpi(const char *code)
{
    return strstr(code, "#include <mpi.h>") || strstr(code, "#include <infinicp/mpi.h>");
}

/* What starts an MPI example: "env 'NAME=VALUE'... 'mpirun' <options> ". */
static void mpi_launcher(char *buf, size_t cap)
{
    size_t w = (size_t)snprintf(buf, cap, "env");
    for (int i = 0; i < n_mpi_env && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, " '%s'", mpi_env[i]);
    if (w < cap)
        w += (size_t)snprintf(buf + w, cap - w, " '%s' --allow-run-as-root --oversubscribe -np 2 ",
                              mpirun_path);
    assert_true(w < cap);
}

/* Build and run one example in a fresh, empty working directory, which it
 * must leave empty. Returns 0 if it passed; otherwise prints why and what
 * the compiler and the program said. */
static int run_example(const char *name, const char *code, const char *libdir)
{
    char src[4200], exe[4200], log[4200], dir[4200], launch[8192] = "", cmd[32768];
    int mpi = needs_mpi(code);
    snprintf(src, sizeof src, "%s/example-%s.c", scratch_dir, name);
    snprintf(exe, sizeof exe, "%s/example-%s", scratch_dir, name);
    snprintf(log, sizeof log, "%s/example-%s.log", scratch_dir, name);
    snprintf(dir, sizeof dir, "%s/example-%s.d", scratch_dir, name);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    fputs(code, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir); /* left over by an earlier failure */
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    if (mpi)
        mpi_launcher(launch, sizeof launch);
    int n = snprintf(cmd, sizeof cmd,
                     "%s -std=c99 -pedantic -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L -I'%s/..' '%s' -o '%s' "
                     "-L'%s' -Wl,-rpath,'%s' -linfinicp -lpthread >'%s' 2>&1 && cd '%s' && timeout 120 %s'%s' >>'%s' 2>&1",
                     mpi ? mpicc_cmd : cc_cmd, include_dir, src, exe, libdir, libdir, log, dir, launch, exe, log);
    assert_true(n > 0 && (size_t)n < sizeof cmd);
    int rc = system(cmd);
    if (rc != 0) {
        char *out = read_file(log);
        print_error("%s.3: the EXAMPLE does not build or does not exit 0 (%d): %s\n%s\n", name, rc, cmd,
                    out ? out : "");
        free(out);
        return 1;
    }
    if (rmdir(dir) != 0) {
        print_error("%s.3: the EXAMPLE left files in its working directory %s\n", name, dir);
        return 1;
    }
    return 0;
}

static void test_man_examples_build_and_run(void **state)
{
    (void)state;
    DIR *d = opendir(man_dir);
    assert_non_null(d);
    struct dirent *e;
    int examples = 0, skipped = 0, bad = 0;
    char libdir[4096];
    snprintf(libdir, sizeof libdir, "%s", lib_path);
    char *slash = strrchr(libdir, '/');
    if (slash)
        *slash = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".3"))
            continue;
        char path[4096], name[256];
        snprintf(path, sizeof path, "%s/%s", man_dir, e->d_name);
        snprintf(name, sizeof name, "%.*s", (int)(len - 2), e->d_name);
        char *text = read_file(path);
        assert_non_null(text);
        int is_alias = !strncmp(text, ".so ", 4);
        char *code = is_alias ? NULL : example_of(text);
        free(text);
        if (is_alias)
            continue;
        if (!code) {
            print_error("%s has no EXAMPLE program (.SH EXAMPLE with .EX/.EE)\n", e->d_name);
            bad++;
        } else if (needs_mpi(code) && !mpicc_cmd) {
            /* said out loud, so a build without MPI never passes it silently */
            print_message("%s: SKIPPED the EXAMPLE: an MPI program, and no MPI compiler and launcher "
                          "were given (no MPI in this build, or no mpicc/mpirun)\n",
                          e->d_name);
            skipped++;
        } else {
            bad += run_example(name, code, libdir);
            examples++;
        }
        free(code);
    }
    closedir(d);
    if (skipped)
        print_message("%d MPI example(s) SKIPPED: build with MPI (-Dmpi=enabled) to run them\n", skipped);
    assert_true(examples > 0);
    assert_int_equal(bad, 0);
}

int main(int argc, char **argv)
{
    if (argc < 8 || (argc > 8 && (argc < 11 || strcmp(argv[8], "--mpi")))) {
        fprintf(stderr,
                "usage: %s LIB MAPFILE INCLUDEDIR MANDIR SYMBOLSFILE CC SCRATCHDIR\n"
                "          [--mpi MPICC MPIRUN [NAME=VALUE]...]\n",
                argv[0]);
        return 2;
    }
    if (argc > 8) {
        mpicc_cmd = argv[9];
        mpirun_path = argv[10];
        mpi_env = argv + 11;
        n_mpi_env = argc - 11;
    }
    for (int i = 1; i < argc; i++) {
        if (strchr(argv[i], '\'')) { /* they are quoted with ' in shell commands */
            fprintf(stderr, "%s: argument %s contains a quote\n", argv[0], argv[i]);
            return 2;
        }
    }
    cc_cmd = argv[6];
    scratch_dir = argv[7];
    lib_path = argv[1];
    map_path = argv[2];
    include_dir = argv[3];
    man_dir = argv[4];
    symbols_path = argv[5];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exports_match_version_script),
        cmocka_unit_test(test_version_script_matches_headers),
        cmocka_unit_test(test_debian_symbols_match),
        cmocka_unit_test(test_every_symbol_has_a_man_page),
        cmocka_unit_test(test_overview_page_lists_every_function),
        cmocka_unit_test(test_man_pages_lint_clean),
        cmocka_unit_test(test_man_examples_build_and_run),
    };
    return cmocka_run_group_tests_name("abi", tests, NULL, NULL);
}

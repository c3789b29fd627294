/* SPDX-License-Identifier: MIT */
/* Backends and modules: which backend drives a device (registry.c, cpu.c),
 * and how the core finds modules and what it hands them (module.c). */
#ifndef INFINICP_BACKEND_INTERNAL_H
#define INFINICP_BACKEND_INTERNAL_H

#include "core/internal.h"

/* The built-in CPU backend. Its copies, conversions and reductions need no
 * state, so host memory is served by it with a NULL state. */
const cp_backend_ops *cpi_cpu_backend(void);

/* The backend of a device kind: the CPU one, or a module's, loaded on the
 * first call that succeeds and kept for the process. */
cp_status cpi_backend_for(cp_device device, const cp_backend_ops **ops);

/* The host side of the module ABI, handed to every module. */
extern const cp_module_host cpi_module_host;

/* Look up `symbol` in module `file` under INFINICP_MODULE_PATH or the
 * installed module directory; a found module stays loaded for the process. */
cp_status cpi_module_symbol(const char *file, const char *symbol, void **fn);

#endif

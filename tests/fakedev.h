/* SPDX-License-Identifier: MIT */
/* A pretend device backend for tests: its memory holds every byte XOR 0xA5,
 * so only its own copy_2d / convert / reduce give meaningful results. Code
 * that moves device data through the backend table works on it; code that
 * reads device memory directly (or treats it as host memory) reads garbage.
 * It calls itself CP_DEVICE_CUDA so that transports stage it like a GPU. */
#ifndef INFINICP_TEST_FAKEDEV_H
#define INFINICP_TEST_FAKEDEV_H

#include <infinicp/backend.h>

const cp_backend_ops *fakedev_ops(void);

#endif

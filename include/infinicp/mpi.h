/* SPDX-License-Identifier: MIT */
/**
 * @file mpi.h
 * @brief Typed MPI convenience wrapper of libinfinicp.
 *
 * <infinicp/infinicp.h> takes foreign communicators as `void *` so that it
 * needs no MPI headers; this header adds the typed form for programs that
 * build with MPI anyway.
 */
#ifndef INFINICP_MPI_H
#define INFINICP_MPI_H

#include <mpi.h>

#include <infinicp/infinicp.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief cp_comm_create_mpi() taking the MPI_Comm itself.
 *
 * Collective over @p comm. The library duplicates the communicator, so the
 * caller keeps @p comm and may free it afterwards.
 * @param comm an intracommunicator of an initialised MPI.
 * @param out receives the communicator.
 * @return as cp_comm_create_mpi().
 */
static inline cp_status cp_comm_create_mpi_comm(MPI_Comm comm, cp_comm **out)
{
    return cp_comm_create_mpi(&comm, out);
}

#ifdef __cplusplus
}
#endif

#endif /* INFINICP_MPI_H */

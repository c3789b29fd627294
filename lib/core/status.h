/* SPDX-License-Identifier: MIT */
/* The text of each status, behind cp_status_string(). A header, because the
 * modules that print another rank's status (transport-mpi.so) do not link
 * the core. */
#ifndef INFINICP_STATUS_H
#define INFINICP_STATUS_H

#include <infinicp/infinicp.h>

static inline const char *cpi_status_text(cp_status s)
{
    switch (s) {
    case CP_SUCCESS: return "success";
    case CP_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case CP_ERROR_UNSUPPORTED: return "unsupported";
    case CP_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CP_ERROR_BACKEND: return "backend error";
    case CP_ERROR_COMM: return "communication error";
    case CP_ERROR_TIMEOUT: return "timeout";
    case CP_ERROR_MISMATCH: return "mismatch between ranks";
    case CP_ERROR_FORMAT: return "malformed data";
    case CP_ERROR_IO: return "input/output error";
    case CP_ERROR_NOT_FOUND: return "not found";
    case CP_ERROR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

#endif

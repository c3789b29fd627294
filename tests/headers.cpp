/* SPDX-License-Identifier: MIT */
/* Each public header, included first and alone, compiles as C++11 under
 * -std=c++11 -pedantic -Wall -Wextra -Werror (see meson.build). */
#include <infinicp/backend.h>
#include <infinicp/infinicp.h>

int main(void)
{
    cp_context_config c = CP_CONTEXT_CONFIG_INIT;
    cp_topology_config t = CP_TOPOLOGY_CONFIG_INIT;
    cp_group_config g = CP_GROUP_CONFIG_INIT;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    cp_pack_config p = CP_PACK_CONFIG_INIT;
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    /* the initialisers must fill struct_size (and leave API 1.2's descales off) */
    return !(c.struct_size == sizeof c && t.struct_size == sizeof t && g.struct_size == sizeof g &&
             d.struct_size == sizeof d && a.struct_size == sizeof a && m.struct_size == sizeof m &&
             p.struct_size == sizeof p && x.struct_size == sizeof x && !x.q_descale && !x.k_descale &&
             !x.v_descale && !x.descale_per_head && !a.q_descale && !a.descale_per_head &&
             CP_DTYPE_FP8_E4M3 == 4 && cp_version() == CP_VERSION);
}

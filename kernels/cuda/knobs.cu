// SPDX-License-Identifier: MIT
// Reading the CUDA module's environment variables (knobs.cuh declares them).
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "common.cuh"

namespace cu {
namespace {

struct knob_word {
    const char *word;
    int value;
};

// The value of the word variable holds; fallback when it is unset or holds
// none of them.
int knob_value(const char *variable, int fallback, const knob_word *words, size_t n)
{
    const char *v = getenv(variable);
    for (size_t i = 0; v && i < n; i++)
        if (!strcmp(v, words[i].word))
            return words[i].value;
    return fallback;
}

} // namespace

knobs read_knobs()
{
    knobs k;
#define CU_KNOB_READ(field, variable, fallback, ...)                                                                   \
    {                                                                                                                  \
        static const knob_word words[] = {__VA_ARGS__};                                                                \
        k.field = knob_value(variable, fallback, words, sizeof words / sizeof words[0]);                               \
    }
    CU_KNOBS(CU_KNOB_READ)
#undef CU_KNOB_READ
    return k;
}

} // namespace cu

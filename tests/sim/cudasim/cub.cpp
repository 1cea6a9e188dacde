// cub.cpp: the non-template parts of the sim's CUB subset (include/cub/cub.cuh):
// the temporary-storage protocol and the device-memory checks.
#include <cub/cub.cuh>


namespace cub {
namespace sim {

bool temp_storage(const char *algorithm, void *temp, size_t *bytes, size_t need, cudaError_t *err) {
    *err = cudaSuccess;
    if (!temp) {
        *bytes = need;
        return false;
    }
    if (*bytes < need) {
        *err = cudaErrorInvalidValue;
        return false;
    }
    require_device(algorithm, "d_temp_storage", temp, *bytes);
    return true;
}

void require_device(const char *algorithm, const char *what, const void *p, size_t bytes) {
    if (bytes && !cudasim::is_device(p, bytes))
        cudasim::fail("%s: %s (%p, %zu bytes) is not inside one device allocation", algorithm, what, p, bytes);
}

}  // namespace sim
}  // namespace cub

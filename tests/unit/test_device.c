/* Device selection: cpu always runs; an unknown device and an unavailable cuda (not built, or
 * no GPU) fail with DSV4_E_DEVICE and a message, at the probe and at load. */
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "dsv4.h"

int main(void)
{
    char desc[256], dir[2048];
    dsv4_err err;
    CHECK(dsv4_device_probe("cpu", desc, sizeof desc, &err) == 0 && !strncmp(desc, "cpu", 3), "cpu probe: %s", err.msg);
    CHECK(dsv4_device_probe("tpu", desc, sizeof desc, &err) == DSV4_E_DEVICE && strstr(err.msg, "unknown"),
          "an unknown device must fail naming it: %s", err.msg);
    int rc = dsv4_device_probe("cuda", desc, sizeof desc, &err);
    CHECK(rc == 0 || (rc == DSV4_E_DEVICE && err.msg[0]), "cuda probe: rc %d, %s", rc, err.msg);
    printf("  cuda here: %s\n", rc ? err.msg : desc);
    snprintf(dir, sizeof dir, "%s", CHECK_FIXTURES "/v4/v4-tiny-a");
    dsv4_load_opts o = {.device = "tpu"};
    dsv4_model *m = dsv4_model_load(dir, &o, &err);
    CHECK(!m && err.code == DSV4_E_DEVICE, "load on an unknown device must fail with DSV4_E_DEVICE: %s", err.msg);
    dsv4_model_free(m);
    if (rc) { /* cuda unavailable here: the load says so too */
        o.device = "cuda";
        m = dsv4_model_load(dir, &o, &err);
        CHECK(!m && err.code == DSV4_E_DEVICE && err.msg[0], "load on cuda without one must fail: %s", err.msg);
        dsv4_model_free(m);
    }
    return check_summary("device");
}

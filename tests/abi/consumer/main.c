/* A minimal libkvarn consumer: checks the run-time version against the header it was compiled
 * with, then creates and destroys a CPU context. Exit status 0 on success. */
#include <kvarn/kvarn.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  char expected[64];
  const char* version = kvarn_version_string();
  kvarn_context_options_t options;
  kvarn_context_t* context = NULL;
  kvarn_backend_t backend = KVARN_BACKEND_AUTO;
  kvarn_status_t status;

  snprintf(expected, sizeof expected, "%d.%d.%d", KVARN_VERSION_MAJOR, KVARN_VERSION_MINOR,
           KVARN_VERSION_PATCH);
  if (version == NULL || strcmp(version, expected) != 0) {
    fprintf(stderr, "kvarn_version_string() = \"%s\", header says \"%s\"\n",
            version ? version : "(null)", expected);
    return 1;
  }
  if (kvarn_version_number() != (uint32_t)KVARN_VERSION_NUMBER ||
      kvarn_abi_version() != (uint32_t)KVARN_ABI_VERSION) {
    fprintf(stderr, "version number %u / ABI %u differ from the header's %d / %d\n",
            (unsigned)kvarn_version_number(), (unsigned)kvarn_abi_version(), KVARN_VERSION_NUMBER,
            KVARN_ABI_VERSION);
    return 1;
  }

  kvarn_context_options_defaults(&options);
  options.backend = KVARN_BACKEND_CPU;
  status = kvarn_context_create(&options, &context);
  if (status != KVARN_OK || context == NULL) {
    fprintf(stderr, "kvarn_context_create: %s: %s\n", kvarn_status_string(status),
            kvarn_last_error());
    return 1;
  }
  status = kvarn_context_get_backend(context, &backend);
  if (status != KVARN_OK || backend != KVARN_BACKEND_CPU) {
    fprintf(stderr, "kvarn_context_get_backend: %s (%s), backend %s\n", kvarn_status_string(status),
            kvarn_last_error(), kvarn_backend_name(backend));
    kvarn_context_destroy(context);
    return 1;
  }
  kvarn_context_destroy(context);
  kvarn_context_destroy(NULL); /* a no-op by contract */

  printf("kvarn consumer OK: libkvarn %s (ABI %u), backend %s\n", version,
         (unsigned)kvarn_abi_version(), kvarn_backend_name(backend));
  return 0;
}

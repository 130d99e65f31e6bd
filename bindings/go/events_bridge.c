// The C side of Config.OnEvent: liblease calls qlEventTrampoline on its
// broker thread; it hands the event to the Go function behind the cgo.Handle
// passed as the user pointer.
#include <stdint.h>

#include "_cgo_export.h"

static void qlEventTrampoline(void *user, lease_event_kind kind, const char *message) {
  goLeaseEvent((uintptr_t)user, kind, (char *)message);
}

lease_status qlSetEventHandle(const lease_limiter *l, uintptr_t handle) {
  return lease_set_event_callback(l, handle ? qlEventTrampoline : NULL, (void *)handle);
}

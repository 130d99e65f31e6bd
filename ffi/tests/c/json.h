/* A minimal JSON reader for the C conformance-vector runner (the vectors are
 * small, trusted files): objects, arrays, strings with escapes, integers read
 * exactly as uint64 when they are non-negative integers, true/false/null. */
#ifndef QL_JSON_H
#define QL_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype type;
  int boolean;        /* J_BOOL */
  double num;         /* J_NUM */
  int is_uint;        /* J_NUM: a non-negative integer that fits uint64 */
  uint64_t uint;      /* J_NUM when is_uint */
  char *str;          /* J_STR: NUL-terminated */
  size_t len;         /* J_STR: length in bytes */
  size_t count;       /* J_ARR / J_OBJ */
  struct jval *items; /* J_ARR / J_OBJ values */
  char **keys;        /* J_OBJ keys */
} jval;

/* Parse text; NULL on error with a message in err. Free with json_free. */
jval *json_parse(const char *text, char *err, size_t errcap);
void json_free(jval *v);
/* Member of an object, or NULL. */
const jval *json_get(const jval *obj, const char *key);
/* Read a whole file (NUL-terminated, malloc'd), or NULL. */
char *json_read_file(const char *path);
/* Compact text of a value (malloc'd), for messages. */
char *json_dump(const jval *v);

#endif

#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *p;
  char *err;
  size_t errcap;
  int failed;
  int depth;
} parser;

static void fail(parser *ps, const char *what) {
  if (!ps->failed) {
    snprintf(ps->err, ps->errcap, "%s near '%.20s'", what, ps->p);
  }
  ps->failed = 1;
}

static void ws(parser *ps) {
  while (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t') ps->p++;
}

static int parse_value(parser *ps, jval *out);

static void free_inner(jval *v) {
  size_t i;
  if (v->type == J_STR) free(v->str);
  if (v->type == J_ARR || v->type == J_OBJ) {
    for (i = 0; i < v->count; i++) {
      free_inner(&v->items[i]);
      if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
  }
  memset(v, 0, sizeof *v);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int read_hex4(parser *ps, unsigned *cp) {
  int i;
  *cp = 0;
  for (i = 0; i < 4; i++) {
    int h = hexval(ps->p[i]);
    if (h < 0) {
      fail(ps, "bad \\u escape");
      return 0;
    }
    *cp = (*cp << 4) | (unsigned)h;
  }
  ps->p += 4;
  return 1;
}

static size_t utf8_put(char *dst, unsigned cp) {
  if (cp < 0x80) {
    dst[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    dst[0] = (char)(0xC0 | (cp >> 6));
    dst[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    dst[0] = (char)(0xE0 | (cp >> 12));
    dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  dst[0] = (char)(0xF0 | (cp >> 18));
  dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  dst[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static char *parse_string(parser *ps, size_t *len) {
  /* The decoded string is never longer than the source text. */
  const char *start = ps->p;
  size_t cap = 0, n = 0;
  char *buf;
  ps->p++; /* opening quote */
  while (start[cap + 1] && start[cap + 1] != '"') {
    if (start[cap + 1] == '\\' && start[cap + 2]) cap++;
    cap++;
  }
  buf = malloc(cap + 8);
  if (!buf) {
    fail(ps, "out of memory");
    return NULL;
  }
  for (;;) {
    char c = *ps->p;
    if (c == '\0') {
      fail(ps, "unterminated string");
      free(buf);
      return NULL;
    }
    if (c == '"') {
      ps->p++;
      break;
    }
    if ((unsigned char)c < 0x20) {
      fail(ps, "control character in string");
      free(buf);
      return NULL;
    }
    if (c != '\\') {
      buf[n++] = c;
      ps->p++;
      continue;
    }
    ps->p++;
    c = *ps->p++;
    switch (c) {
      case '"': buf[n++] = '"'; break;
      case '\\': buf[n++] = '\\'; break;
      case '/': buf[n++] = '/'; break;
      case 'b': buf[n++] = '\b'; break;
      case 'f': buf[n++] = '\f'; break;
      case 'n': buf[n++] = '\n'; break;
      case 'r': buf[n++] = '\r'; break;
      case 't': buf[n++] = '\t'; break;
      case 'u': {
        unsigned cp, lo;
        if (!read_hex4(ps, &cp)) {
          free(buf);
          return NULL;
        }
        if (cp >= 0xD800 && cp < 0xDC00 && ps->p[0] == '\\' && ps->p[1] == 'u') {
          ps->p += 2;
          if (!read_hex4(ps, &lo)) {
            free(buf);
            return NULL;
          }
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        n += utf8_put(buf + n, cp);
        break;
      }
      default:
        fail(ps, "bad escape");
        free(buf);
        return NULL;
    }
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

static int parse_number(parser *ps, jval *out) {
  const char *s = ps->p;
  char *end;
  int integer = 1;
  const char *q = s;
  if (*q == '-') {
    integer = 0;
    q++;
  }
  while (*q >= '0' && *q <= '9') q++;
  if (*q == '.' || *q == 'e' || *q == 'E') integer = 0;
  errno = 0;
  out->type = J_NUM;
  out->num = strtod(s, &end);
  if (end == s) {
    fail(ps, "bad number");
    return 0;
  }
  if (integer) {
    unsigned long long u;
    errno = 0;
    u = strtoull(s, NULL, 10);
    if (errno == 0) {
      out->is_uint = 1;
      out->uint = (uint64_t)u;
    }
  }
  ps->p = end;
  return 1;
}

static int push(parser *ps, jval *arr, char *key, jval *item) {
  jval *items = realloc(arr->items, (arr->count + 1) * sizeof *items);
  if (!items) {
    fail(ps, "out of memory");
    return 0;
  }
  arr->items = items;
  if (arr->type == J_OBJ) {
    char **keys = realloc(arr->keys, (arr->count + 1) * sizeof *keys);
    if (!keys) {
      fail(ps, "out of memory");
      return 0;
    }
    arr->keys = keys;
    arr->keys[arr->count] = key;
  }
  arr->items[arr->count++] = *item;
  return 1;
}

static int parse_container(parser *ps, jval *out, char close) {
  out->type = close == '}' ? J_OBJ : J_ARR;
  if (++ps->depth > 64) {
    fail(ps, "nesting too deep");
    return 0;
  }
  ps->p++;
  ws(ps);
  if (*ps->p == close) {
    ps->p++;
    ps->depth--;
    return 1;
  }
  for (;;) {
    char *key = NULL;
    jval item;
    memset(&item, 0, sizeof item);
    ws(ps);
    if (close == '}') {
      size_t klen;
      if (*ps->p != '"') {
        fail(ps, "expected a key");
        return 0;
      }
      key = parse_string(ps, &klen);
      if (!key) return 0;
      ws(ps);
      if (*ps->p != ':') {
        free(key);
        fail(ps, "expected ':'");
        return 0;
      }
      ps->p++;
    }
    if (!parse_value(ps, &item) || !push(ps, out, key, &item)) {
      free(key);
      free_inner(&item);
      return 0;
    }
    ws(ps);
    if (*ps->p == ',') {
      ps->p++;
      continue;
    }
    if (*ps->p == close) {
      ps->p++;
      ps->depth--;
      return 1;
    }
    fail(ps, "expected ',' or a closing bracket");
    return 0;
  }
}

static int parse_value(parser *ps, jval *out) {
  memset(out, 0, sizeof *out);
  ws(ps);
  switch (*ps->p) {
    case '{': return parse_container(ps, out, '}');
    case '[': return parse_container(ps, out, ']');
    case '"':
      out->type = J_STR;
      out->str = parse_string(ps, &out->len);
      return out->str != NULL;
    case 't':
      if (strncmp(ps->p, "true", 4) == 0) {
        ps->p += 4;
        out->type = J_BOOL;
        out->boolean = 1;
        return 1;
      }
      break;
    case 'f':
      if (strncmp(ps->p, "false", 5) == 0) {
        ps->p += 5;
        out->type = J_BOOL;
        return 1;
      }
      break;
    case 'n':
      if (strncmp(ps->p, "null", 4) == 0) {
        ps->p += 4;
        out->type = J_NULL;
        return 1;
      }
      break;
    default:
      if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return parse_number(ps, out);
  }
  fail(ps, "unexpected character");
  return 0;
}

jval *json_parse(const char *text, char *err, size_t errcap) {
  parser ps = {text, err, errcap, 0, 0};
  jval *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  if (!parse_value(&ps, v)) {
    json_free(v);
    return NULL;
  }
  ws(&ps);
  if (*ps.p != '\0') {
    fail(&ps, "trailing text");
    json_free(v);
    return NULL;
  }
  return v;
}

void json_free(jval *v) {
  if (!v) return;
  free_inner(v);
  free(v);
}

const jval *json_get(const jval *obj, const char *key) {
  size_t i;
  if (!obj || obj->type != J_OBJ) return NULL;
  for (i = 0; i < obj->count; i++) {
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  }
  return NULL;
}

char *json_read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

typedef struct {
  char *s;
  size_t n, cap;
} sbuf;

static void sput(sbuf *b, const char *s) {
  size_t l = strlen(s);
  if (b->n + l + 1 > b->cap) {
    size_t cap = (b->cap + l + 1) * 2;
    char *p = realloc(b->s, cap);
    if (!p) return;
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, l + 1);
  b->n += l;
}

static void dump(sbuf *b, const jval *v) {
  char tmp[64];
  size_t i;
  switch (v->type) {
    case J_NULL: sput(b, "null"); break;
    case J_BOOL: sput(b, v->boolean ? "true" : "false"); break;
    case J_NUM:
      if (v->is_uint) snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v->uint);
      else snprintf(tmp, sizeof tmp, "%g", v->num);
      sput(b, tmp);
      break;
    case J_STR:
      sput(b, "\"");
      if (v->len > 40) {
        snprintf(tmp, sizeof tmp, "%.20s...(%zu bytes)", v->str, v->len);
        sput(b, tmp);
      } else {
        sput(b, v->str);
      }
      sput(b, "\"");
      break;
    case J_ARR:
    case J_OBJ:
      sput(b, v->type == J_ARR ? "[" : "{");
      for (i = 0; i < v->count; i++) {
        if (i) sput(b, ",");
        if (v->type == J_OBJ) {
          sput(b, "\"");
          sput(b, v->keys[i]);
          sput(b, "\":");
        }
        dump(b, &v->items[i]);
      }
      sput(b, v->type == J_ARR ? "]" : "}");
      break;
  }
}

char *json_dump(const jval *v) {
  sbuf b = {NULL, 0, 0};
  sput(&b, "");
  if (v) dump(&b, v);
  return b.s;
}

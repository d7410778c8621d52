/* input.c — reading input files within stated limits: files and pipes only (not
 * directories or devices such as /dev/zero), at most
 * SIM_INPUT_MAX_BYTES, no NUL byte, and JSON nested at most SIM_JSON_MAX_DEPTH levels
 * (json-glib's parser recurses once per level, so deeper text would overflow the stack). */
#include "sim-private.h"
#include "json-read.h"

#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t mode)
{
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a pipe";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}

/* The line (from 1) of byte @at of @text. */
static gsize line_of(const char *text, gsize at)
{
  gsize line = 1;
  for (gsize i = 0; i < at; i++)
    line += text[i] == '\n';
  return line;
}

gboolean sim_check_text(const char *text, gsize len, const char *filename, GError **error)
{
  const char *nul = memchr(text, '\0', len);
  if (nul) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                "%s: line %" G_GSIZE_FORMAT ": a NUL byte (expected text)",
                filename ? filename : "<input>", line_of(text, (gsize)(nul - text)));
    return FALSE;
  }
  return TRUE;
}

gboolean sim_read_file(const char *path, char **contents, gsize *length, GError **error)
{
  g_return_val_if_fail(path != NULL && contents != NULL, FALSE);
  *contents = NULL;
  /* O_NONBLOCK: opening a FIFO with no writer must not wait; a regular file ignores it. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(e), "cannot open %s: %s", path,
                g_strerror(e));
    return FALSE;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(e), "cannot read %s: %s", path,
                g_strerror(e));
    return FALSE;
  }
  if (S_ISFIFO(st.st_mode)) {
    /* A pipe (a shell's <(...)) is read up to the limit, waiting for its writer. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  } else if (!S_ISREG(st.st_mode)) {
    close(fd);
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                "%s: %s; expected a file", path, file_kind(st.st_mode));
    return FALSE;
  }
  if (S_ISREG(st.st_mode) && st.st_size > SIM_INPUT_MAX_BYTES) {
    close(fd);
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED,
                "%s: %.1f MiB is larger than the %d MiB that parasol reads from one file",
                path, (double)st.st_size / (1 << 20), SIM_INPUT_MAX_BYTES >> 20);
    return FALSE;
  }
  /* One byte past the limit tells a file that grew while it was read. */
  gsize cap = (gsize)SIM_INPUT_MAX_BYTES + 1, size = S_ISREG(st.st_mode) ? (gsize)st.st_size + 1 : 65536, n = 0;
  char *buf = g_malloc(size + 1);
  for (;;) {
    if (n == size) {
      if (size >= cap)
        break;
      size = MIN(size * 2, cap);
      buf = g_realloc(buf, size + 1);
    }
    ssize_t got = read(fd, buf + n, size - n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      int e = errno;
      close(fd);
      g_free(buf);
      g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(e), "cannot read %s: %s", path,
                  g_strerror(e));
      return FALSE;
    }
    if (got == 0)
      break;
    n += (gsize)got;
  }
  close(fd);
  if (n > (gsize)SIM_INPUT_MAX_BYTES) {
    g_free(buf);
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_FAILED,
                "%s: larger than the %d MiB that parasol reads from one file", path,
                SIM_INPUT_MAX_BYTES >> 20);
    return FALSE;
  }
  buf[n] = '\0';
  if (!sim_check_text(buf, n, path, error)) {
    g_free(buf);
    return FALSE;
  }
  *contents = buf;
  if (length)
    *length = n;
  return TRUE;
}

/* The checks themselves are libbase's (base/json-read.c), which the readers of libsim and
 * libprofile share. */
gboolean sim_json_check(const char *text, gssize length, GError **error)
{
  return sim_json_check_limits(text, length, error);
}

gboolean sim_json_load(JsonParser *parser, const char *text, gssize length, GError **error)
{
  return sim_json_parse(parser, text, length, error);
}

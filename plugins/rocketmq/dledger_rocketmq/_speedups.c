/* Optional C speedups of dledger-rocketmq's per-message loops (Round 2g, broker8).
 *
 * quick_unit(body): dledger_rocketmq.store.dispatch.quick_unit, the consume-queue dispatch's fast path, which
 * every member runs for every message it indexes.  The Python function is the reference: this one gives the
 * same answer for every input (tests/rocketmq/test_rmq_speedups.py compares them on golden, random and damaged
 * records), from the same constants (configure(), called once by dledger_rocketmq.native with the Python
 * module's values), and hands anything that is not exactly ``bytes`` to the Python function.
 *
 * Whether this module is used is decided in one place, dledger_rocketmq/native.py (DLEDGER_PURE=1: never).
 * The module touches Python objects throughout, so the GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define V4_HEAD_SIZE 88

static int configured = 0;
static long message_magic, slow_flags, host_v6_flags, tx_mask, tx_commit;
static PyObject *schedule_topic = NULL;  /* bytes */
static PyObject *tags_key = NULL;        /* bytes */
static PyObject *fallback = NULL;        /* the Python quick_unit */

static inline int32_t be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static inline int64_t be64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)be32(p) << 32) | (uint64_t)(uint32_t)be32(p + 4));
}

/* First occurrence of needle (n bytes) wholly inside [start, end), or -1 (bytes.find(needle, start, end)). */
static Py_ssize_t find_in(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, const unsigned char *needle,
                          Py_ssize_t n) {
    for (Py_ssize_t i = start; i + n <= end; i++) {
        const unsigned char *hit = memchr(buf + i, needle[0], (size_t)(end - n + 1 - i));
        if (hit == NULL)
            return -1;
        i = hit - buf;
        if (memcmp(hit, needle, (size_t)n) == 0)
            return i;
    }
    return -1;
}

/* Last occurrence of needle wholly inside [start, end), or -1 (bytes.rfind(needle, start, end)). */
static Py_ssize_t rfind_in(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, const unsigned char *needle,
                           Py_ssize_t n) {
    for (Py_ssize_t i = end - n; i >= start; i--) {
        if (buf[i] == needle[0] && memcmp(buf + i, needle, (size_t)n) == 0)
            return i;
    }
    return -1;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *sched, *key, *fb;
    if (!PyArg_ParseTuple(args, "lllllO!O!O:configure", &message_magic, &slow_flags, &host_v6_flags, &tx_mask,
                          &tx_commit, &PyBytes_Type, &sched, &PyBytes_Type, &key, &fb))
        return NULL;
    if (PyBytes_GET_SIZE(key) < 1) {
        PyErr_SetString(PyExc_ValueError, "the TAGS key must not be empty");
        return NULL;
    }
    Py_INCREF(sched);
    Py_XSETREF(schedule_topic, sched);
    Py_INCREF(key);
    Py_XSETREF(tags_key, key);
    Py_INCREF(fb);
    Py_XSETREF(fallback, fb);
    configured = 1;
    Py_RETURN_NONE;
}

static PyObject *quick_unit(PyObject *self, PyObject *body) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.configure() was not called");
        return NULL;
    }
    if (!PyBytes_CheckExact(body))
        return PyObject_CallOneArg(fallback, body);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    if (size < V4_HEAD_SIZE)
        Py_RETURN_NONE;
    int32_t total = be32(b), magic = be32(b + 4), qid = be32(b + 12), sys_flag = be32(b + 36);
    int32_t body_len = be32(b + 84);
    int64_t qoff = be64(b + 20), phys = be64(b + 28);
    if (magic != message_magic || total != size || body_len < 0)
        Py_RETURN_NONE;
    if ((sys_flag & slow_flags) && ((sys_flag & host_v6_flags) || ((sys_flag & tx_mask) != 0
                                                                   && (sys_flag & tx_mask) != tx_commit)))
        Py_RETURN_NONE;
    Py_ssize_t pos = V4_HEAD_SIZE + (Py_ssize_t)body_len;
    if (pos >= size)
        Py_RETURN_NONE;
    Py_ssize_t topic_end = pos + 1 + b[pos];
    if (topic_end + 2 > size)
        Py_RETURN_NONE;
    Py_ssize_t topic_len = topic_end - (pos + 1);
    if (topic_len == PyBytes_GET_SIZE(schedule_topic)
        && memcmp(b + pos + 1, PyBytes_AS_STRING(schedule_topic), (size_t)topic_len) == 0)
        Py_RETURN_NONE;
    Py_ssize_t start = topic_end + 2;
    if (start + (Py_ssize_t)((b[topic_end] << 8) | b[topic_end + 1]) != size)
        Py_RETURN_NONE;
    const unsigned char *key = (const unsigned char *)PyBytes_AS_STRING(tags_key);
    Py_ssize_t key_len = PyBytes_GET_SIZE(tags_key);
    Py_ssize_t i = rfind_in(b, start, size, key, key_len);
    PyObject *tags;
    if (i < 0) {
        tags = Py_None;
        Py_INCREF(tags);
    } else {
        if (i != start && (b[i - 1] != 2 || find_in(b, start, i, key, key_len) >= 0))
            Py_RETURN_NONE;
        Py_ssize_t from = i + key_len;
        const unsigned char *sep = from < size ? memchr(b + from, 2, (size_t)(size - from)) : NULL;
        Py_ssize_t value_end = sep != NULL ? sep - b : size;
        if (value_end <= from)
            Py_RETURN_NONE;  /* an empty TAGS value: the full decode's business */
        tags = PyBytes_FromStringAndSize((const char *)b + from, value_end - from);
        if (tags == NULL)
            return NULL;
    }
    PyObject *topic = PyBytes_FromStringAndSize((const char *)b + pos + 1, topic_len);
    if (topic == NULL) {
        Py_DECREF(tags);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(NiLLnN)", topic, (int)qid, (long long)qoff, (long long)phys, size, tags);
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(magic, slow_flags, host_v6_flags, tx_mask, tx_commit, schedule_topic, tags_key, fallback): the "
     "Python module's constants, and the function non-bytes bodies are handed to."},
    {"quick_unit", quick_unit, METH_O, "dledger_rocketmq.store.dispatch.quick_unit, in C (same answers)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dledger_rocketmq._speedups",
                                    "Optional C speedups of dledger-rocketmq (pure-Python reference: see native.py).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }

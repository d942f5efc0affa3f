/* Optional C speedups of dledger-rocketmq's per-message loops (Round 2g, broker8).
 *
 * quick_unit(body): dledger_rocketmq.store.dispatch.quick_unit, the consume-queue dispatch's fast path, which
 * every member runs for every message it indexes.  The Python function is the reference: this one gives the
 * same answer for every input (tests/rocketmq/test_rmq_speedups.py compares them on golden, random and damaged
 * records), from the same constants (configure(), called once by dledger_rocketmq.common.native with the Python
 * module's values), and hands anything that is not exactly ``bytes`` to the Python function.
 *
 * encode_batch(...): the loop of dledger_rocketmq.common.message.encode_batch_records (a SEND_BATCH_MESSAGE's
 * records on the master), for as many leading items as it can encode exactly as the Python loop would; the
 * Python function encodes the rest (and names any error), so a limit, a field out of range or an item that is
 * not a 3-tuple only ends the C part early.
 *
 * Whether this module is used is decided in one place, dledger_rocketmq/common/native.py (DLEDGER_PURE=1: never).
 * The module touches Python objects throughout, so the GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <zlib.h>

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

static inline void put32(unsigned char *p, int64_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24); p[1] = (unsigned char)(u >> 16); p[2] = (unsigned char)(u >> 8);
    p[3] = (unsigned char)u;
}

static inline void put64(unsigned char *p, int64_t v) {
    put32(p, (int64_t)((uint64_t)v >> 32));
    put32(p + 4, v);
}

static inline int fits32(long long v) { return v >= INT32_MIN && v <= INT32_MAX; }

static uLong crc_of(const unsigned char *buf, Py_ssize_t n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt chunk = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        crc = crc32(crc, buf, chunk);
        buf += chunk;
        n -= chunk;
    }
    return crc;
}

/* encode_batch(items, fixed, magic, qid, sys_flag, born_ts, middle, reconsume, prepared, topic_part,
 *              first_qoff, step, max_size, max_props) -> list of bytes for the leading items it encoded. */
static PyObject *encode_batch(PyObject *self, PyObject *args) {
    PyObject *items, *middle, *topic_part, *first_obj;
    long long fixed, magic, qid, sys_flag, born_ts, reconsume, prepared, step, max_size, max_props;
    if (!PyArg_ParseTuple(args, "OLLLLLO!LLO!OLLL:encode_batch", &items, &fixed, &magic, &qid, &sys_flag, &born_ts,
                          &PyBytes_Type, &middle, &reconsume, &prepared, &PyBytes_Type, &topic_part, &first_obj,
                          &step, &max_size, &max_props))
        return NULL;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    int overflow = 0;
    long long qoff = PyLong_Check(first_obj) ? PyLong_AsLongLongAndOverflow(first_obj, &overflow) : 0;
    if (!PyLong_Check(first_obj) || overflow || (qoff == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        goto done;  /* Python's loop decides */
    }
    if (!fits32(magic) || !fits32(qid) || !fits32(sys_flag) || !fits32(reconsume))
        goto done;
    const char *mid = PyBytes_AS_STRING(middle);
    Py_ssize_t mid_len = PyBytes_GET_SIZE(middle), tp_len = PyBytes_GET_SIZE(topic_part);
    const char *tp = PyBytes_AS_STRING(topic_part);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **its = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = its[k];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 3)
            break;
        PyObject *flag_obj = PyTuple_GET_ITEM(item, 2);
        if (!PyLong_Check(flag_obj))
            break;
        long long flag = PyLong_AsLongLongAndOverflow(flag_obj, &overflow);
        if (overflow || (flag == -1 && PyErr_Occurred()) || !fits32(flag)) {
            PyErr_Clear();
            break;
        }
        PyObject *body_obj = PyTuple_GET_ITEM(item, 0), *props_obj = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(props_obj))
            break;
        if (!PyBytes_CheckExact(body_obj)) {  /* else only a view of plain bytes, as batch_views makes */
            if (!PyMemoryView_Check(body_obj))
                break;
            Py_buffer *v = PyMemoryView_GET_BUFFER(body_obj);
            if (v->ndim != 1 || v->itemsize != 1 || v->strides == NULL || v->strides[0] != 1
                || (v->format != NULL && strcmp(v->format, "B") != 0))
                break;
        }
        Py_buffer body, props;
        if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            break;
        }
        if (PyObject_GetBuffer(props_obj, &props, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            PyBuffer_Release(&body);
            break;
        }
        long long size = fixed + (long long)body.len + (long long)props.len;
        int stop = size > max_size || props.len > max_props || !fits32(size) || !fits32(body.len)
                   || props.len > 0x7FFF;
        PyObject *rec = NULL;
        if (!stop) {
            rec = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(48 + mid_len + 16 + body.len + tp_len + 2 + props.len));
            if (rec != NULL) {
                unsigned char *p = (unsigned char *)PyBytes_AS_STRING(rec);
                const unsigned char *bb = (const unsigned char *)body.buf;
                put32(p, size); put32(p + 4, magic); put32(p + 8, (int64_t)(crc_of(bb, body.len) & 0x7FFFFFFF));
                put32(p + 12, qid); put32(p + 16, flag); put64(p + 20, qoff); put64(p + 28, 0);
                put32(p + 36, sys_flag); put64(p + 40, born_ts);
                p += 48;
                memcpy(p, mid, (size_t)mid_len); p += mid_len;
                put32(p, reconsume); put64(p + 4, prepared); put32(p + 12, body.len); p += 16;
                memcpy(p, bb, (size_t)body.len); p += body.len;
                memcpy(p, tp, (size_t)tp_len); p += tp_len;
                p[0] = (unsigned char)(props.len >> 8); p[1] = (unsigned char)props.len; p += 2;
                memcpy(p, props.buf, (size_t)props.len);
            }
        }
        PyBuffer_Release(&body);
        PyBuffer_Release(&props);
        if (stop)
            break;
        if (rec == NULL || PyList_Append(out, rec) < 0) {
            Py_XDECREF(rec);
            Py_DECREF(out);
            Py_DECREF(seq);
            return NULL;
        }
        Py_DECREF(rec);
        if ((step > 0 && qoff > INT64_MAX - step) || (step < 0 && qoff < INT64_MIN - step))
            break;  /* the next queue offset does not fit: Python's loop names it */
        qoff += step;
    }
done:
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(magic, slow_flags, host_v6_flags, tx_mask, tx_commit, schedule_topic, tags_key, fallback): the "
     "Python module's constants, and the function non-bytes bodies are handed to."},
    {"encode_batch", encode_batch, METH_VARARGS,
     "The records of encode_batch_records for the leading items it can encode exactly (Python does the rest)."},
    {"quick_unit", quick_unit, METH_O, "dledger_rocketmq.store.dispatch.quick_unit, in C (same answers)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dledger_rocketmq.common._speedups",
                                    "Optional C speedups of dledger-rocketmq (pure-Python reference: see native.py).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }

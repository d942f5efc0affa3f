/* dledger._native_c: the entry codec's per-entry loops over a whole batch, in C (optional; issue #28 Round 2g).
 *
 * The pure-Python code in dledger/entry.py and dledger/store/mmapwriter.py is the reference; this module is
 * used only through dledger/_native.py (DLEDGER_PURE=1 turns it off) and only gives the same results:
 *
 *   decode_run(buf, offset, end, count, accept_zero_crc, out)  a follower's push: headers, bounds, CRCs,
 *       one Entry per entry appended to ``out``; None (``out`` left empty) as soon as an entry is not
 *       valid, so the pure decoder names the failure; else (offset after, largest, index records or None).
 *   encode_plain(entries, buf, off, wp, limit, max_size, index, out, irecs)  a leader's plain run: header,
 *       body and CRC into ``buf``, an Entry per entry, its index record; stops where the pure loop stops.
 *   crc32c(data)  crc32c of a buffer (unsigned), for the equivalence tests.
 *
 * Every Python object is touched with the GIL held (it is never released here).  Entries are made as
 * Entry's own __init__ makes them (a slots dataclass: only the eight slots set), without running it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_CRC 1
#else
#define HAVE_HW_CRC 0
#endif

#define HEADER_SIZE 48
#define INDEX_UNIT 32
#define NFIELDS 8 /* body, index, term, pos, magic, channel, chain_crc, body_crc: Entry's fields in order */

static PyTypeObject *entry_type = NULL;
static Py_ssize_t slot_off[NFIELDS];
static int32_t valid_magics[16];
static int n_magics = 0;
static int hw_crc = 0;
static PyObject *zero = NULL;

static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c_sw(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

#if HAVE_HW_CRC
/* SSE4.2's crc32 instruction, 8 bytes a step (the CPU is asked once, at import: HW_CRC32C). */
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const unsigned char *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 32) {
        uint64_t a, b, d, e;
        memcpy(&a, p, 8);
        memcpy(&b, p + 8, 8);
        memcpy(&d, p + 16, 8);
        memcpy(&e, p + 24, 8);
        c = _mm_crc32_u64(c, a);
        c = _mm_crc32_u64(c, b);
        c = _mm_crc32_u64(c, d);
        c = _mm_crc32_u64(c, e);
        p += 32;
        n -= 32;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

static inline uint32_t crc32c(const unsigned char *p, size_t n) {
#if HAVE_HW_CRC
    if (hw_crc) return crc32c_hw(p, n);
#endif
    return crc32c_sw(p, n);
}

static inline int32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)__builtin_bswap32(v);
}
static inline int64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}
static inline void wr32(unsigned char *p, int32_t x) {
    uint32_t v = __builtin_bswap32((uint32_t)x);
    memcpy(p, &v, 4);
}
static inline void wr64(unsigned char *p, int64_t x) {
    uint64_t v = __builtin_bswap64((uint64_t)x);
    memcpy(p, &v, 8);
}

static inline int magic_valid(int32_t m) {
    for (int i = 0; i < n_magics; i++)
        if (valid_magics[i] == m) return 1;
    return 0;
}

#define SLOT(obj, i) (*(PyObject **)((char *)(obj) + slot_off[i]))

/* A new Entry with its eight slots set (references stolen; NULL, all released, on failure). */
static PyObject *make_entry(PyObject *vals[NFIELDS]) {
    PyObject *e = entry_type->tp_alloc(entry_type, 0);
    for (int i = 0; i < NFIELDS; i++) {
        if (vals[i] == NULL) {
            Py_XDECREF(e);
            for (int k = 0; k < NFIELDS; k++) Py_XDECREF(vals[k]);
            return NULL;
        }
    }
    if (e == NULL) {
        for (int k = 0; k < NFIELDS; k++) Py_DECREF(vals[k]);
        return NULL;
    }
    for (int i = 0; i < NFIELDS; i++) SLOT(e, i) = vals[i];
    return e;
}

static PyObject *native_init(PyObject *self, PyObject *args) {
    PyObject *type, *names, *magics;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &type, &PyTuple_Type, &names, &PyTuple_Type, &magics))
        return NULL;
    if (PyTuple_GET_SIZE(names) != NFIELDS || PyTuple_GET_SIZE(magics) > 16) {
        PyErr_SetString(PyExc_ValueError, "init: eight field names and at most 16 magics");
        return NULL;
    }
    for (int i = 0; i < NFIELDS; i++) {
        PyObject *d = PyObject_GetAttr(type, PyTuple_GET_ITEM(names, i));
        if (d == NULL) return NULL;
        if (Py_TYPE(d) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(d);
            PyErr_SetString(PyExc_TypeError, "init: every field must be a plain __slots__ member");
            return NULL;
        }
        slot_off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
    }
    n_magics = (int)PyTuple_GET_SIZE(magics);
    for (int i = 0; i < n_magics; i++) {
        long m = PyLong_AsLong(PyTuple_GET_ITEM(magics, i));
        if (m == -1 && PyErr_Occurred()) return NULL;
        valid_magics[i] = (int32_t)m;
    }
    Py_INCREF(type);
    Py_XSETREF(entry_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

static PyObject *native_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    uint32_t c = crc32c((const unsigned char *)b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *native_decode_run(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t offset, end, count;
    int accept_zero;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "y*nnnpO!", &b, &offset, &end, &count, &accept_zero, &PyList_Type, &out))
        return NULL;
    /* more entries than headers fit (a hostile count): no records buffer of that size, the pure decoder fails */
    if (entry_type == NULL || offset < 0 || end > b.len || count < 0 || end < offset ||
        count > (end - offset) / HEADER_SIZE) {
        PyBuffer_Release(&b);
        Py_RETURN_NONE; /* unusual arguments: the pure decoder decides */
    }
    const unsigned char *buf = (const unsigned char *)b.buf;
    Py_ssize_t off = offset;
    int64_t next_index = -1, next_pos = -1, largest = 0, max_term = -1;
    Py_ssize_t breaks = 0;
    int first_plain = 0;
    PyObject *irecs = PyBytes_FromStringAndSize(NULL, count * INDEX_UNIT);
    if (irecs == NULL) goto error;
    unsigned char *ir = (unsigned char *)PyBytes_AS_STRING(irecs);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - off < HEADER_SIZE) goto fallback;
        const unsigned char *h = buf + off;
        /* header layout >iiqqqiiii: magic 0, size 4, index 8, term 16, pos 24, channel 32, chain 36, crc 40, n 44 */
        int32_t magic = rd32(h), size = rd32(h + 4), channel = rd32(h + 32), chain = rd32(h + 36);
        int32_t crc = rd32(h + 40), n = rd32(h + 44);
        int64_t index = rd64(h + 8), term = rd64(h + 16), pos = rd64(h + 24);
        if (!magic_valid(magic) || (int64_t)size != (int64_t)HEADER_SIZE + n || n < 0 || index < 0 || term < 0 ||
            pos < 0 || (int64_t)off + size > (int64_t)end)
            goto fallback;
        const unsigned char *body = h + HEADER_SIZE;
        if (!(crc == 0 && accept_zero) && crc32c(body, (size_t)n) != (uint32_t)crc) goto fallback;
        PyObject *vals[NFIELDS] = {
            PyBytes_FromStringAndSize((const char *)body, n), PyLong_FromLongLong(index),
            PyLong_FromLongLong(term), PyLong_FromLongLong(pos), PyLong_FromLong(magic),
            PyLong_FromLong(channel), PyLong_FromLong(chain), PyLong_FromLong(crc)};
        PyObject *e = make_entry(vals);
        if (e == NULL) goto error;
        int rc = PyList_Append(out, e);
        Py_DECREF(e);
        if (rc < 0) goto error;
        if (index != next_index || pos != next_pos || channel || chain || !crc) breaks++;
        if (i == 0) first_plain = !(channel || chain || !crc);
        if (size > largest) largest = size;
        if (term > max_term) max_term = term;
        next_index = index + 1;
        next_pos = pos + size;
        unsigned char *r = ir + i * INDEX_UNIT; /* >iqiqq: magic, pos, size, index, term */
        wr32(r, magic);
        wr64(r + 4, pos);
        wr32(r + 12, size);
        wr64(r + 16, index);
        wr64(r + 24, term);
        off += size;
    }
    PyBuffer_Release(&b);
    if (!(breaks == 1 && first_plain)) {
        largest = 0;
        Py_CLEAR(irecs);
        irecs = Py_None;
        Py_INCREF(irecs);
    }
    return Py_BuildValue("nLNL", off, (long long)largest, irecs, (long long)max_term);
fallback:
    PyBuffer_Release(&b);
    Py_XDECREF(irecs);
    if (PyList_SetSlice(out, 0, PyList_GET_SIZE(out), NULL) < 0) return NULL;
    Py_RETURN_NONE;
error:
    PyBuffer_Release(&b);
    Py_XDECREF(irecs);
    return NULL;
}

/* The int value of an exact int object into *v; 0 if it is not one or does not fit. */
static inline int as_i64(PyObject *o, int64_t *v) {
    if (!PyLong_Check(o)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *v = x;
    return 1;
}

static PyObject *native_encode_plain(PyObject *self, PyObject *args) {
    PyObject *entries, *out;
    Py_buffer b, ib;
    Py_ssize_t off, max_size;
    long long wp, limit, index;
    if (!PyArg_ParseTuple(args, "Ow*nLLnLO!w*", &entries, &b, &off, &wp, &limit, &max_size, &index, &PyList_Type,
                          &out, &ib))
        return NULL;
    PyObject *seq = PySequence_Fast(entries, "entries must be a sequence");
    if (seq == NULL || entry_type == NULL) {
        PyBuffer_Release(&b);
        PyBuffer_Release(&ib);
        if (seq == NULL) return NULL;
        Py_DECREF(seq);
        return Py_BuildValue("nL", (Py_ssize_t)0, wp);
    }
    Py_ssize_t total = PySequence_Fast_GET_SIZE(seq), taken = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    unsigned char *buf = (unsigned char *)b.buf, *ir = (unsigned char *)ib.buf;
    for (; taken < total; taken++) {
        PyObject *entry = items[taken];
        if (Py_TYPE(entry) != entry_type) break; /* anything else: the pure loop goes on from here */
        PyObject *body = SLOT(entry, 0), *term_o = SLOT(entry, 2), *magic_o = SLOT(entry, 4);
        PyObject *chan_o = SLOT(entry, 5), *chain_o = SLOT(entry, 6);
        if (body == NULL || term_o == NULL || magic_o == NULL || chan_o == NULL || chain_o == NULL) break;
        if (!PyBytes_CheckExact(body)) break;
        int64_t magic, term, chan, chain;
        if (!as_i64(magic_o, &magic) || !as_i64(term_o, &term) || !as_i64(chan_o, &chan) || !as_i64(chain_o, &chain))
            break;
        Py_ssize_t n = PyBytes_GET_SIZE(body);
        int64_t size = HEADER_SIZE + (int64_t)n;
        if (wp + size > limit || size > max_size || chan || chain) break;
        /* what struct would refuse to pack: the pure loop raises there */
        if (magic < INT32_MIN || magic > INT32_MAX || size > INT32_MAX || (Py_ssize_t)(off + size) > b.len ||
            (taken + 1) * INDEX_UNIT > ib.len)
            break;
        const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(body);
        int32_t crc = (int32_t)crc32c(src, (size_t)n);
        unsigned char *h = buf + off;
        wr32(h, (int32_t)magic);
        wr32(h + 4, (int32_t)size);
        wr64(h + 8, index);
        wr64(h + 16, term);
        wr64(h + 24, wp);
        wr32(h + 32, 0);
        wr32(h + 36, 0);
        wr32(h + 40, crc);
        wr32(h + 44, (int32_t)n);
        memcpy(h + HEADER_SIZE, src, (size_t)n);
        Py_INCREF(body);
        Py_INCREF(term_o);
        Py_INCREF(magic_o);
        Py_INCREF(zero);
        Py_INCREF(zero);
        PyObject *vals[NFIELDS] = {body, PyLong_FromLongLong(index), term_o, PyLong_FromLongLong(wp), magic_o,
                                   zero, zero, PyLong_FromLong(crc)};
        PyObject *e = make_entry(vals);
        if (e == NULL) goto error;
        int rc = PyList_Append(out, e);
        Py_DECREF(e);
        if (rc < 0) goto error;
        unsigned char *r = ir + taken * INDEX_UNIT;
        wr32(r, (int32_t)magic);
        wr64(r + 4, wp);
        wr32(r + 12, (int32_t)size);
        wr64(r + 16, index);
        wr64(r + 24, term);
        off += size;
        wp += size;
        index++;
    }
    Py_DECREF(seq);
    PyBuffer_Release(&b);
    PyBuffer_Release(&ib);
    return Py_BuildValue("nL", taken, wp);
error:
    Py_DECREF(seq);
    PyBuffer_Release(&b);
    PyBuffer_Release(&ib);
    return NULL;
}

static PyMethodDef methods[] = {
    {"init", native_init, METH_VARARGS, "init(entry_type, field_names, valid_magics): bind Entry's slots."},
    {"crc32c", native_crc32c, METH_VARARGS, "crc32c(data) -> unsigned crc32c of a buffer."},
    {"decode_run", native_decode_run, METH_VARARGS,
     "decode_run(buf, offset, end, count, accept_zero_crc, out) -> (offset, largest, irecs, max_term) or None."},
    {"encode_plain", native_encode_plain, METH_VARARGS,
     "encode_plain(entries, buf, off, wp, limit, max_size, index, out, irecs) -> (taken, wp)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "dledger._native_c",
                                    "The entry codec's batch loops in C (see dledger/_native.py).", -1, methods};

PyMODINIT_FUNC PyInit__native_c(void) {
    crc_table_init();
#if HAVE_HW_CRC
    __builtin_cpu_init();
    hw_crc = __builtin_cpu_supports("sse4.2");
#endif
    zero = PyLong_FromLong(0);
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "HW_CRC32C", hw_crc) < 0) return NULL;
    return m;
}

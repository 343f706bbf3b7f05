// kdtr_io.hpp -- the generic input reader, output set and parameter wiring of the
// kdtr_<op> binaries, built on the op table (kdtr_ops.hpp; docs/binaries.md, "The op table").
//
// From an op's declaration (OpDecl) each binary
//   - reads and checks its inputs (Inputs::read): a dim is bound by the first tensor that
//     shows it and every later tensor must agree (kdtr::File::get's WrongShape), each dim
//     is checked once against its bound, where it first appears in a tensor;
//   - declares its outputs (Outputs::declare), checks their bytes against the output limit
//     (Outputs::require_within_limit), allocates them poisoned (Outputs::allocate) and
//     writes them in declaration order with kdtr::Writer (write_outputs);
//   - fills the op's parameter struct (TreeBuildParams, VerifyAttnProblem,
//     TreeAcceptParams of <op>_params.h) from host or device pointers by name (Slots,
//     *_params).
//
// With --graph (docs/binaries.md, "Graph replay") the input file holds two data sets of one
// shape: the first replay's (replay1.<name>, FirstReplay: read and checked as the second's
// are) and the second's (input.<name>); the run keeps one set of input and output buffers
// (Host here; Device in kdtr_cuda.hpp), loads the first set, runs, keeps a copy of the
// outputs (Outputs::keep_first_replay), loads the second set over the first, runs again
// without clearing the outputs, and writes both replays' outputs (replay1.<name>, <name>).
//
// What stays in test_<op>.cu is op-specific: value checks (d_v, lengths), the CPU
// scratch limits, the CUDA kernel choice, and which struct goes to which backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddtree_decode_params.h"
#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_ops.hpp"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

namespace kdtr {
namespace ops {

// ---------------------------------------------------------------------------------------
// Dims and tensors
// ---------------------------------------------------------------------------------------

class Dims {
 public:
  bool has(const std::string& d) const { return v_.count(d) != 0; }
  int64_t operator[](const std::string& d) const {
    auto it = v_.find(d);
    if (it == v_.end()) throw std::logic_error("kdtr::ops: dim " + d + " is not bound");
    return it->second;
  }
  void set(const std::string& d, int64_t value) { v_[d] = value; }
  // "B = 3" (for limit messages).
  std::string eq(const std::string& d) const { return d + " = " + std::to_string((*this)[d]); }

 private:
  std::map<std::string, int64_t> v_;
};

// One tensor of an input or output set: `data` points into the golden's mapping (inputs)
// or at `storage` (outputs).
struct Tensor {
  std::string name;
  DType dtype = DType::U8;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
  void* data = nullptr;
  std::vector<uint8_t> storage;
};

class TensorList {
 public:
  const std::vector<Tensor>& all() const { return t_; }
  const Tensor& find(const std::string& name) const {
    for (const Tensor& t : t_)
      if (t.name == name) return t;
    throw std::logic_error("kdtr::ops: no tensor " + name);
  }
  // The data of `name` as T (T of the dtype's item size).
  template <class T>
  T* get(const std::string& name) const {
    const Tensor& t = find(name);
    if (sizeof(T) != dtype_itemsize(t.dtype)) throw std::logic_error("kdtr::ops: " + name + " read as a wrong type");
    return static_cast<T*>(t.data);
  }

 protected:
  std::vector<Tensor> t_;
};

namespace detail {

// kdtr::File::get (its lookup, dtype and shape checks and their messages) for a shape
// known at run time: -1 matches any size.
template <class U>
void get_shape(const File& g, const std::string& name, const std::vector<int64_t>& s, DType dt) {
  switch (s.size()) {
    case 0: (void)g.get<U>(name, {}, dt); break;
    case 1: (void)g.get<U>(name, {s[0]}, dt); break;
    case 2: (void)g.get<U>(name, {s[0], s[1]}, dt); break;
    case 3: (void)g.get<U>(name, {s[0], s[1], s[2]}, dt); break;
    case 4: (void)g.get<U>(name, {s[0], s[1], s[2], s[3]}, dt); break;
    default: throw std::logic_error("kdtr::ops: rank over 4 in the op table");
  }
}

inline void get_checked(const File& g, const std::string& name, const std::vector<int64_t>& s, DType dt) {
  switch (dtype_itemsize(dt)) {
    case 1: get_shape<uint8_t>(g, name, s, dt); break;
    case 2: get_shape<uint16_t>(g, name, s, dt); break;
    case 4: get_shape<uint32_t>(g, name, s, dt); break;
    default: get_shape<uint64_t>(g, name, s, dt); break;
  }
}

}  // namespace detail

// An input error about a value (exit 2): "InvalidArgument: <path>: <tensor>: <detail>".
[[noreturn]] inline void invalid(const File& g, const std::string& tensor, const std::string& detail) {
  throw Error(ErrorCode::InvalidArgument, g.path(), tensor, NO_OFFSET, detail);
}

// The prefix of the first replay's data set in a --graph input file ("replay1.<name>" for
// the "input.<name>" of the op table); its outputs are written as "replay1.<output>".
constexpr const char* kInputPrefix = "input.";
constexpr const char* kReplay1Prefix = "replay1.";

// The inputs of a golden, read and checked op by op against the table.  `prefix` is the
// prefix of the names read from the file ("input.", or kReplay1Prefix for --graph's first
// data set); the tensors keep their table names ("input.<name>") whatever it is.
class Inputs : public TensorList {
 public:
  Inputs(const File& golden, std::vector<Bound> bounds, std::string prefix = kInputPrefix)
      : g_(golden), bounds_(std::move(bounds)), prefix_(std::move(prefix)) {}

  // Read op's inputs in table order (skipping the `wired` ones), then its metadata.
  void read(const OpDecl& op, const std::vector<std::pair<const char*, const char*>>& wired = {}) {
    for (const TensorDecl& t : op.inputs) {
      bool is_wired = false;
      for (const auto& w : wired) is_wired = is_wired || t.name == std::string(w.first);
      if (!is_wired) read_tensor(t);
    }
    if (op.max_budget) {
      const int64_t N = cli::read_max_budget(g_);
      dims_.set("N", N);
      dims_.set("T", N + 1);
    }
  }
  void read(const Link& link) { read(*link.op, link.wired); }

  const File& golden() const { return g_; }
  const std::vector<Bound>& bounds() const { return bounds_; }
  const std::string& prefix() const { return prefix_; }
  // The name in the file of the table's input `name` ("input.q" -> prefix + "q").
  std::string file_name(const std::string& name) const {
    const size_t n = std::strlen(kInputPrefix);
    return name.compare(0, n, kInputPrefix) == 0 ? prefix_ + name.substr(n) : name;
  }
  const Dims& dims() const { return dims_; }
  int64_t dim(const std::string& d) const { return dims_[d]; }
  // Bind a dim that is a value, not a shape (d_v).
  void bind(const std::string& d, int64_t value) { dims_.set(d, value); }
  // The scalar input `name` (shape []).
  template <class T>
  T scalar(const std::string& name) const {
    return *get<const T>(name);
  }

 private:
  const Bound* bound(const std::vector<std::string>& dims) const {
    for (const Bound& b : bounds_) {
      if (b.dims.size() != dims.size()) continue;
      bool same = true;
      for (size_t k = 0; k < dims.size(); ++k) same = same && dims[k] == b.dims[k];
      if (same) return &b;
    }
    return nullptr;
  }

  void read_tensor(const TensorDecl& t) {
    const std::string name = file_name(t.name);
    const TensorView& v = g_.tensor(name);
    DType dt = t.dtype;
    if (t.rule == DtypeRule::Float) {
      if (v.dtype != DType::F32 && v.dtype != DType::BF16)
        throw Error(ErrorCode::WrongDtype, g_.path(), v.name, NO_OFFSET,
                    std::string("tensor has dtype ") + dtype_name(v.dtype) + ", expected f32 or bf16");
      dt = float_dtype_ = v.dtype;
    } else if (t.rule == DtypeRule::SameFloat) {
      dt = float_dtype_;
    }
    std::vector<int64_t> want;
    for (const char* d : t.dims) want.push_back(dims_.has(d) ? dims_[d] : -1);
    const bool none_known = std::all_of(want.begin(), want.end(), [](int64_t w) { return w == -1; });
    if (t.rank_names_dims && none_known && v.shape.size() != t.dims.size())
      throw Error(ErrorCode::WrongShape, g_.path(), v.name, NO_OFFSET,
                  "tensor has " + std::to_string(v.shape.size()) + " dims, expected " + std::to_string(t.dims.size()) +
                      " [" + detail::join(t.dims, ",") + "]");
    detail::get_checked(g_, name, want, dt);
    // Each dim against its bound, once: where it first shows in a tensor; then products.
    for (size_t k = 0; k < t.dims.size(); ++k) {
      const Bound* b = bound({t.dims[k]});
      if (b == nullptr || checked_.count(t.dims[k])) continue;
      cli::require_dim_at_most(g_, v.name, v.shape[k], b->max, t.dims[k]);
      checked_.insert(t.dims[k]);
    }
    for (const Bound& b : bounds_) {
      if (b.dims.size() < 2) continue;
      const std::string label = detail::join(b.dims, "*");
      uint64_t value = 1;
      bool here = checked_.count(label) == 0;
      for (const char* f : b.dims) {
        size_t k = 0;
        while (k < t.dims.size() && std::string(t.dims[k]) != f) ++k;
        here = here && k < t.dims.size();
        if (here) value *= v.shape[k];
      }
      if (!here) continue;
      cli::require_dim_at_most(g_, v.name, value, b.max, label.c_str());
      checked_.insert(label);
    }
    for (size_t k = 0; k < t.dims.size(); ++k)
      if (!dims_.has(t.dims[k])) dims_.set(t.dims[k], static_cast<int64_t>(v.shape[k]));
    Tensor in;
    in.name = t.name;
    in.dtype = dt;
    in.shape = v.shape;
    in.nbytes = v.nbytes;
    in.data = const_cast<uint8_t*>(v.data);
    t_.push_back(std::move(in));
  }

  const File& g_;
  std::vector<Bound> bounds_;
  std::string prefix_;
  Dims dims_;
  std::set<std::string> checked_;
  DType float_dtype_ = DType::F32;
};

// d_v, the i32 scalar input.d_v, in [1, Dqk]; bound as the dim d_v of the outputs.
inline int64_t read_d_v(Inputs& in) {
  const int32_t d_v = in.scalar<int32_t>("input.d_v");
  const int64_t Dqk = in.dim("Dqk");
  if (d_v < 1 || d_v > Dqk)
    invalid(in.golden(), "input.d_v",
            "d_v " + std::to_string(d_v) + " is outside [1, Dqk = " + std::to_string(Dqk) + "]");
  in.bind("d_v", d_v);
  return d_v;
}

// --graph's first data set (docs/binaries.md, "Graph replay"): the inputs replay1.<name>,
// read and checked by `read` exactly as the second data set (input.<name>, `second`) was,
// and required to have its dtypes and shapes, and the same bytes for every scalar (a graph
// holds a scalar such as sm_scale as it was captured).  An input error in it names the
// file's tensor (replay1.<name>).  Without --graph: on() is false and nothing is read.
class FirstReplay {
 public:
  template <class Read>
  FirstReplay(const cli::Args& args, const Inputs& second, Read&& read) {
    if (!args.graph) return;
    in_ = std::make_unique<Inputs>(second.golden(), second.bounds(), kReplay1Prefix);
    try {
      read(*in_);
    } catch (const Error& e) {  // a value check names the table's input.<name>: the file's is replay1.<name>
      if (e.field() == in_->file_name(e.field())) throw;
      throw Error(e.code(), e.path(), in_->file_name(e.field()), e.has_offset() ? e.offset() : NO_OFFSET, e.detail());
    }
    const std::vector<Tensor>&a = in_->all(), &b = second.all();
    if (a.size() != b.size()) throw std::logic_error("kdtr::ops: the replays read different input lists");
    for (size_t k = 0; k < a.size(); ++k) {
      const std::string name = in_->file_name(a[k].name);
      if (a[k].dtype != b[k].dtype)
        invalid(second.golden(), name,
                std::string("dtype ") + dtype_name(a[k].dtype) + " differs from " + b[k].name + "'s " +
                    dtype_name(b[k].dtype) + " (both replays run on one set of buffers)");
      if (a[k].shape != b[k].shape)
        invalid(second.golden(), name,
                "shape " + shape_text(a[k].shape) + " differs from " + b[k].name + "'s " + shape_text(b[k].shape) +
                    " (both replays run on one set of buffers)");
      if (a[k].shape.empty() && std::memcmp(a[k].data, b[k].data, static_cast<size_t>(a[k].nbytes)) != 0)
        invalid(
            second.golden(), name,
            "differs from " + b[k].name + " (a scalar is captured in the graph by value: both replays need the same)");
    }
  }
  bool on() const { return in_ != nullptr; }
  // The first data set (on() only).
  const Inputs& inputs() const { return *in_; }

 private:
  static std::string shape_text(const std::vector<uint64_t>& s) {
    std::string t = "[";
    for (size_t k = 0; k < s.size(); ++k) t += (k ? "," : "") + std::to_string(s[k]);
    return t + "]";
  }
  std::unique_ptr<Inputs> in_;
};

// The outputs of one run: declared from the table (shapes only), checked against the
// output limit, then allocated with every byte kPoison (an element the op fails to write
// cannot pass an exact comparison by chance).
class Outputs : public TensorList {
 public:
  // op's outputs, named prefix + name, shaped by `dims`.
  void declare(const OpDecl& op, const Dims& dims, const std::string& prefix = "") {
    for (const TensorDecl& d : op.outputs) {
      Tensor t;
      t.name = prefix + d.name;
      t.dtype = d.dtype;
      for (const char* n : d.dims) t.shape.push_back(static_cast<uint64_t>(dims[n]));
      std::vector<uint64_t> factors = t.shape;
      factors.push_back(dtype_itemsize(d.dtype));
      const cli::Bytes b = cli::Bytes::product(factors);
      bytes_ = bytes_ + b;
      t.nbytes = b.exact;
      t_.push_back(std::move(t));
    }
  }
  const cli::Bytes& bytes() const { return bytes_; }
  // Every output together against kMaxOutputBytes (cli::require_output_bytes).
  void require_within_limit(const File& g, const std::string& field, const std::string& dims_text) const {
    cli::require_output_bytes(g, field, bytes_, dims_text);
  }
  void allocate() {
    for (Tensor& t : t_) {
      t.storage.assign(static_cast<size_t>(t.nbytes), cli::kPoison);
      t.data = t.storage.data();
    }
  }
  // --graph: keep a copy of the outputs as the first replay left them (written as
  // replay1.<name> after the second replay's <name>; write_outputs).
  void keep_first_replay() {
    first_.clear();
    for (const Tensor& t : t_) {
      Tensor c;
      c.name = kReplay1Prefix + t.name;
      c.dtype = t.dtype;
      c.shape = t.shape;
      c.nbytes = t.nbytes;
      c.storage.assign(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes);
      first_.push_back(std::move(c));
    }
    for (Tensor& c : first_) c.data = c.storage.data();
  }
  const std::vector<Tensor>& first_replay() const { return first_; }
  // --graph on the device: the captured graph's node count (metadata graph_nodes); -1 otherwise.
  int64_t graph_nodes = -1;

 private:
  cli::Bytes bytes_;
  std::vector<Tensor> first_;
};

// OUT: the outputs in declaration order (with --graph: the second replay's, then the first
// replay's as replay1.<name>), with metadata op, config (the golden's, as is), backend,
// device, with --graph graph_replays = 2, and, where given, kernel and further int entries
// (`extra`).
inline void write_outputs(const cli::Args& args, const File& golden, const char* op, const Outputs& out,
                          const std::string* kernel = nullptr,
                          const std::vector<std::pair<std::string, int64_t>>& extra = {}) {
  Writer w;
  for (const Tensor& t : out.all()) w.add(t.name, t.dtype, t.shape, t.data, static_cast<size_t>(t.nbytes));
  if (args.graph && out.first_replay().size() != out.all().size())
    throw std::logic_error("kdtr::ops: --graph run without the first replay's outputs");
  for (const Tensor& t : out.first_replay()) w.add(t.name, t.dtype, t.shape, t.data, static_cast<size_t>(t.nbytes));
  if (args.graph) w.set_metadata("graph_replays", int64_t{2});
  if (out.graph_nodes >= 0) w.set_metadata("graph_nodes", out.graph_nodes);
  w.set_metadata("op", op);
  if (const MetaValue* config = cli::golden_config(golden)) w.set_metadata("config", *config);
  w.set_metadata("backend", args.backend);
  w.set_metadata("device", cli::device_name(args));
  if (kernel != nullptr) w.set_metadata("kernel", *kernel);
  for (const auto& kv : extra) w.set_metadata(kv.first, kv.second);
  w.write(args.output);
}

// ---------------------------------------------------------------------------------------
// Parameter structs from pointers by name (host or device pointers alike)
// ---------------------------------------------------------------------------------------

class Slots {
 public:
  explicit Slots(const Dims& dims) : dims_(&dims) {}
  Slots& add(const std::string& name, void* p, DType dt) {
    p_[name] = {p, dt};
    return *this;
  }
  Slots& add(const TensorList& l) {
    for (const Tensor& t : l.all()) add(t.name, t.data, t.dtype);
    return *this;
  }
  // `to` (an op's input) is the tensor `from` (an earlier op's output).
  Slots& wire(const std::string& to, const std::string& from) { return add(to, at(from).first, at(from).second); }
  // field = the pointer of `name` (T of the dtype's item size).
  template <class T>
  const Slots& bind(T*& field, const std::string& name) const {
    const auto& s = at(name);
    if (sizeof(T) != dtype_itemsize(s.second)) throw std::logic_error("kdtr::ops: " + name + " read as a wrong type");
    field = static_cast<T*>(s.first);
    return *this;
  }
  // Each field = its dim.
  const Slots& dims(std::initializer_list<std::pair<int64_t*, const char*>> fields) const {
    for (const auto& f : fields) *f.first = (*dims_)[f.second];
    return *this;
  }
  DType dtype(const std::string& name) const { return at(name).second; }
  const void* raw(const std::string& name) const { return at(name).first; }

 private:
  const std::pair<void*, DType>& at(const std::string& name) const {
    auto it = p_.find(name);
    if (it == p_.end()) throw std::logic_error("kdtr::ops: no slot " + name);
    return it->second;
  }
  const Dims* dims_;
  std::map<std::string, std::pair<void*, DType>> p_;
};

// The CPU run's input buffers: without --graph the golden's inputs themselves; with
// --graph one host copy of them that takes the first replay's data set, then the
// second's (as Device's buffers do on the device, kdtr_cuda.hpp).
class Host {
 public:
  Host(const Inputs& in, const FirstReplay& first) : second_(&in), first_(&first) {
    if (!first.on()) return;
    for (const Tensor& t : in.all()) {
      Tensor c;
      c.name = t.name;
      c.dtype = t.dtype;
      c.shape = t.shape;
      c.nbytes = t.nbytes;
      c.storage.assign(static_cast<size_t>(t.nbytes), cli::kPoison);
      staged_.push_back(std::move(c));
    }
    for (Tensor& c : staged_) c.data = c.storage.data();
  }
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;
  // The input slots (the staged copy with --graph); add the outputs to them.
  Slots slots(const Dims& dims) const {
    Slots s(dims);
    if (!first_->on()) return s.add(*second_);
    for (const Tensor& t : staged_) s.add(t.name, t.data, t.dtype);
    return s;
  }
  bool graph() const { return first_->on(); }
  // Copy a data set (of the inputs' dtypes and shapes) into the staged buffers.
  void load(const TensorList& set) const {
    for (size_t k = 0; k < staged_.size(); ++k)
      if (staged_[k].nbytes > 0)
        std::memcpy(staged_[k].data, set.all()[k].data, static_cast<size_t>(staged_[k].nbytes));
  }
  const FirstReplay& first() const { return *first_; }
  const Inputs& second() const { return *second_; }

 private:
  const Inputs* second_;
  const FirstReplay* first_;
  std::vector<Tensor> staged_;
};

// The CPU backend's run: `op()` (on the buffers of `host`) once; with --graph, the first
// replay's data set loaded, `op()`, the outputs kept (Outputs::keep_first_replay), the
// second data set loaded over it and `op()` again, the outputs not cleared in between.
// Then with --repeat N (repeat > 0) N timed runs and the timing line.
template <class Op>
void run_cpu(const cli::Args& args, const Host& host, Outputs& out, Op&& op) {
  if (host.graph()) {
    host.load(host.first().inputs());
    op();
    out.keep_first_replay();
    host.load(host.second());
  }
  cli::run_cpu_timed(args.repeat, op);
}

// Inputs are "input.<name>"; outputs are `out` + "<name>" ("" or "<op>." in a chain); the
// field's type says the element type (Slots::bind checks the item size).
inline TreeBuildParams tree_build_params(const Slots& s, const std::string& out = "") {
  TreeBuildParams p{};
  s.bind(p.top_log_probs, "input.top_log_probs").bind(p.top_token_ids, "input.top_token_ids");
  s.bind(p.root_token_ids, "input.root_token_ids").bind(p.budget, "input.budget");
  s.bind(p.depth_limit, "input.depth_limit").bind(p.node_count, out + "node_count");
  s.bind(p.node_token_ids, out + "node_token_ids").bind(p.node_depths, out + "node_depths");
  s.bind(p.parents, out + "parents").bind(p.next_token, out + "next_token");
  s.bind(p.next_sibling, out + "next_sibling").bind(p.visibility, out + "visibility");
  s.bind(p.status, out + "status").dims({{&p.B, "B"}, {&p.D, "D"}, {&p.K, "K"}, {&p.N, "N"}});
  return p;
}

// sm_scale is a value (the host's input.sm_scale), not a pointer.
inline VerifyAttnProblem verify_attn_params(const Slots& s, float sm_scale, const std::string& out = "") {
  VerifyAttnProblem p{};
  p.dtype = s.dtype("input.q") == DType::BF16 ? KDTR_DTYPE_BF16 : KDTR_DTYPE_F32;
  p.q = s.raw("input.q");
  p.kv_cache = s.raw("input.kv_cache");
  s.bind(p.prefix_len, "input.prefix_len").bind(p.tree_len, "input.tree_len");
  s.bind(p.visibility, "input.visibility").bind(p.out, out + "out").bind(p.lse, out + "lse");
  s.dims({{&p.B, "B"}, {&p.T, "T"}, {&p.H, "H"}, {&p.S, "S"}, {&p.Dqk, "Dqk"}, {&p.d_v, "d_v"}});
  p.sm_scale = sm_scale;
  return p;
}

// verify_attn's --kernel (kdtr_verify_attn, and kdtr_greedy_step for its verify_attn
// stage): "auto" (the default), "simt", "mma" or "wgmma".  Anything else, or a forced
// kernel with --backend cpu, is a usage error (exit 2), in the CPU-only build too.
inline std::string verify_attn_kernel_option(const cli::Args& args, const std::string& prog) {
  auto it = args.extra.find("kernel");
  const std::string k = it == args.extra.end() ? "auto" : it->second;
  if (k != "auto" && k != "simt" && k != "mma" && k != "wgmma")
    cli::die(cli::EXIT_USAGE,
             "--kernel must be auto, simt, mma or wgmma, not '" + k + "'; " + cli::Args::usage(prog, {"kernel"}));
  if (k != "auto" && !args.cuda())
    cli::die(cli::EXIT_USAGE,
             "--kernel " + k + " applies to --backend cuda only; " + cli::Args::usage(prog, {"kernel"}));
  return k;
}

inline TreeAcceptParams tree_accept_params(const Slots& s, const std::string& out = "") {
  TreeAcceptParams p{};
  s.bind(p.node_token_ids, "input.node_token_ids").bind(p.next_token, "input.next_token");
  s.bind(p.next_sibling, "input.next_sibling").bind(p.node_count, "input.node_count");
  s.bind(p.target_predict, "input.target_predict").bind(p.accepted_count, out + "accepted_count");
  s.bind(p.accepted_path, out + "accepted_path").bind(p.proposed, out + "proposed");
  s.bind(p.status, out + "status").dims({{&p.B, "B"}, {&p.T, "T"}});
  return p;
}

// draft_depth, draft_top_k and sm_scale are values (the host's scalar inputs).
inline DdtreeDecodeParams ddtree_decode_params(const Slots& s, int64_t draft_depth, int64_t draft_top_k,
                                               float sm_scale) {
  DdtreeDecodeParams p{};
  s.bind(p.target_emb, "input.target_emb").bind(p.target_w_q, "input.target_w_q");
  s.bind(p.target_w_kv, "input.target_w_kv").bind(p.target_w_o, "input.target_w_o");
  s.bind(p.target_w_lm, "input.target_w_lm").bind(p.draft_emb, "input.draft_emb");
  s.bind(p.draft_w_lm, "input.draft_w_lm").bind(p.kv_cache, "input.kv_cache");
  s.bind(p.prefix_len, "input.prefix_len").bind(p.root_token_ids, "input.root_token_ids");
  s.bind(p.budget, "input.budget").bind(p.depth_limit, "input.depth_limit");
  s.bind(p.node_count, "node_count").bind(p.top_log_probs, "top_log_probs");
  s.bind(p.top_token_ids, "top_token_ids").bind(p.accepted_count, "accepted_count");
  s.bind(p.accepted_path, "accepted_path").bind(p.step_tokens, "step_tokens");
  s.bind(p.attn_out, "attn_out").bind(p.final_kv_cache, "final_kv_cache").bind(p.cache_len, "cache_len");
  s.dims({{&p.B, "B"},
          {&p.R, "R"},
          {&p.V, "V"},
          {&p.E, "E"},
          {&p.H, "H"},
          {&p.Dqk, "Dqk"},
          {&p.Dv, "Dv"},
          {&p.S, "S"},
          {&p.N, "N"}});
  p.draft_depth = draft_depth;
  p.draft_top_k = draft_top_k;
  p.sm_scale = sm_scale;
  return p;
}

}  // namespace ops
}  // namespace kdtr

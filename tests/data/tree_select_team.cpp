// tree_select_team.cpp -- the select build (tree_build.cuh: tree_select_grow, tree_select_sort,
// tree_select_node_outputs) run by a team of std::threads, against the heap build
// (tree_build_grow), on random tie-heavy inputs.  tests/binaries/test_tree_select_team.py
// compiles and runs it (g++ -std=c++20, optionally -fsanitize=thread).
//
// The CPU backend runs the select build with a team of one lane; the CUDA kernels with 256
// or 1024 lanes.  This team has `lanes` threads: barriers are a std::barrier, scans and
// reductions go through a shared array between two barriers (all lanes get the same bits,
// as cub's broadcast from thread 0 gives), the atomics are std::atomic_ref.  So the team
// code's own parallel logic (which lane writes which entry, where the barriers are, the
// chunked rank sort and its merge rounds at the chunk sizes of the CUDA teams) is checked
// on any machine, and under ThreadSanitizer a missing barrier shows as a data race.  It is
// not the GPU: the CUDA team primitives themselves (cub) are not modelled.
//
// Usage: tree_select_team LANES CHUNK ITERS   (CHUNK: the team's sort_chunk(), >= 1)
// Prints one line; exit 0 iff every placed request equals the heap build's tree and every
// lane agreed on whether the select build placed it.  -DPLANT_SCAN_BUG makes the team's
// exclusive scan inclusive (the test checks that this fails).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tree_build.cuh"
using namespace kdtr;

struct Shared {
  std::barrier<> bar;
  std::vector<int64_t> scratch;
  explicit Shared(int n) : bar(n), scratch(n) {}
};

struct ThreadTeam {
  Shared* sh;
  int32_t me, n, chunk;
  int32_t lane() const { return me; }
  int32_t lanes() const { return n; }
  void sync() { sh->bar.arrive_and_wait(); }
  int32_t sort_chunk() const { return chunk; }
  int32_t exclusive_sum(int32_t x, int32_t* total) {
    sh->scratch[me] = x;
    sync();
    int32_t pre = 0, all = 0;
    for (int i = 0; i < n; ++i) {
      if (i < me) pre += (int32_t)sh->scratch[i];
      all += (int32_t)sh->scratch[i];
    }
    sync();
    *total = all;
#ifdef PLANT_SCAN_BUG
    return pre + x;
#else
    return pre;
#endif
  }
  template <class V, class F>
  V reduce(V x, F f) {  // lane 0's fold of every lane's value, in lane order, to all lanes
    sh->scratch[me] = 0;
    std::memcpy(&sh->scratch[me], &x, sizeof(V));
    sync();
    V r;
    std::memcpy(&r, &sh->scratch[0], sizeof(V));
    for (int i = 1; i < n; ++i) {
      V y;
      std::memcpy(&y, &sh->scratch[i], sizeof(V));
      r = f(r, y);
    }
    sync();
    return r;
  }
  double min(double x) {
    return reduce(x, [](double a, double b) { return b < a ? b : a; });
  }
  double max(double x) {
    return reduce(x, [](double a, double b) { return b > a ? b : a; });
  }
  int32_t max_int(int32_t x) {
    return reduce(x, [](int32_t a, int32_t b) { return b > a ? b : a; });
  }
  bool any(bool x) {
    return reduce((int32_t)x, [](int32_t a, int32_t b) { return a | b; }) != 0;
  }
  void add(int32_t* p, int32_t v) { std::atomic_ref<int32_t>(*p).fetch_add(v); }
};

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tree_select_team LANES CHUNK ITERS\n");
    return 2;
  }
  const int lanes = std::atoi(argv[1]), chunk = std::atoi(argv[2]), iters = std::atoi(argv[3]);
  if (lanes < 1 || chunk < 1 || iters < 0) {
    std::fprintf(stderr, "tree_select_team: LANES and CHUNK must be >= 1, ITERS >= 0\n");
    return 2;
  }
  std::mt19937_64 rng(lanes * 1000 + chunk);
  int bad = 0, placed_n = 0, fell = 0;
  for (int it = 0; it < iters; ++it) {
    const int D = 1 + rng() % 8, K = 1 + rng() % 12;
    const int N = 1 + rng() % (it % 4 == 0 ? 600 : 140);
    const int budget = rng() % (N + 1), dl = rng() % (D + 1);
    std::vector<float> lp(D * K);
    const int mode = rng() % 4;
    for (auto& x : lp) {
      if (mode == 0) x = -(float)(rng() % 8) / 4.0f;             // heavy ties
      else if (mode == 1) x = -(float)((rng() % 1000) / 100.0);  // ordinary
      else if (mode == 2) x = (rng() % 3 == 0) ? -0.0f : -(float)(rng() % 4) * 0.5f;
      else x = -std::ldexp(1.0f, -(int)(rng() % 40));
    }
    for (int d = 0; d < D; ++d) std::sort(lp.begin() + d * K, lp.begin() + d * K + K, std::greater<float>());
    if (budget == 0 || dl == 0) continue;
    std::vector<double> lpd(D * K);
    for (int e = 0; e < D * K; ++e) lpd[e] = lp[e];
    // heap reference
    const int64_t T = N + 1;
    std::vector<TreeBuildCand> heap(N + 1);
    std::vector<int32_t> sm(5 * T);
    TreeBuildSlots s{sm.data(), sm.data() + T, sm.data() + 2 * T, sm.data() + 3 * T, sm.data() + 4 * T};
    tree_build_init_slots(s, T, 0, 1);
    const int32_t hc = tree_build_grow(lp.data(), K, budget, dl, heap.data(), s);
    // team select build
    // every other request with the roomier set (the depth's children become entries
    // before the raises), the others with room for the capacity only (raises over chains)
    const int64_t cap = tree_select_capacity(N), room = it % 2 ? tree_select_room(N, K) : cap;
    std::vector<double> mem((tree_select_set_bytes(room) + 7) / 8);
    // poison
    std::memset(mem.data(), 0xa5, mem.size() * 8);
    TreeSelectSet set = tree_select_set(mem.data(), cap, room);
    std::vector<int64_t> ids(D * K);
    for (int e = 0; e < D * K; ++e) ids[e] = e;
    std::vector<int64_t> tok(T);
    std::vector<int32_t> dep(T), par(T), nt(T), ns(T);
    Shared sh(lanes);
    std::atomic<int> okc{0};
    int32_t cnt_out = 0;
    std::vector<std::thread> th;
    for (int l = 0; l < lanes; ++l)
      th.emplace_back([&, l] {
        ThreadTeam t{&sh, l, lanes, chunk};
        int32_t count = 0;
        const bool ok = tree_select_grow(t, lpd.data(), K, budget, dl, set, &count);
        if (ok) {
          tree_select_node_outputs(t, set, count, ids.data(), K, 7, T, tok.data(), dep.data(), par.data(), nt.data(),
                                   ns.data());
          if (l == 0) cnt_out = count;
          okc++;
        }
      });
    for (auto& x : th) x.join();
    if (okc == 0) {
      ++fell;
      continue;
    }
    if (okc != lanes) {
      printf("NONUNIFORM it=%d\n", it);
      ++bad;
      continue;
    }
    ++placed_n;
    bool same = cnt_out == hc;
    for (int64_t i = 0; i < T && same; ++i)
      same = par[i] == s.parent[i] && dep[i] == s.depth[i] && nt[i] == s.first_child[i] && ns[i] == s.next_sibling[i];
    if (!same) {
      ++bad;
      printf("DIFF it=%d D=%d K=%d N=%d budget=%d dl=%d mode=%d\n", it, D, K, N, budget, dl, mode);
    }
  }
  printf("lanes=%d chunk=%d: placed %d, fell back %d, bad %d\n", lanes, chunk, placed_n, fell, bad);
  return bad != 0;
}

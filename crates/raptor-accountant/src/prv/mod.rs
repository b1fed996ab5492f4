//! The PRV accountant (Gopi, Lee, Wutschitz 2021) with certified bounds.
//!
//! # Method
//!
//! For a composition of `N` steps with privacy random variables (PRVs) `Y_1 … Y_N` (the privacy
//! loss `ln(P/Q)` evaluated at an output drawn from `P`), the hockey-stick divergence is
//! `δ(ε) = E[f_ε(S)]`, `S = Σ Y_i`, `f_ε(s) = (1 − e^{ε − s})₊`, a non-decreasing function of
//! `S`, with `0 ≤ f_ε ≤ 1`.
//!
//! 1. **Truncation.** Each `Y_i` is clamped to `[a_i, b_i]` (grid-aligned). Clamping changes `S`
//!    only on an event of probability at most `Σ T_i·P(Y_i > b_i)` (upward) or
//!    `Σ T_i·P(Y_i < a_i)` (downward); these masses are added to δ's upper bound, respectively
//!    subtracted from its lower bound.
//! 2. **Pessimistic ("connect the dots") discretization** (Doroshenko, Ghazi, Kamath, Kumar,
//!    Manurangsi 2022). A value `y = kh + u`, `0 ≤ u ≤ h`, of the clamped loss is replaced by
//!    `(k+1)h` with probability `π(u) = (1 − e^{−u})/(1 − e^{−h})`, else by `kh`. This choice
//!    keeps `e^{−Ỹ}` equal to `e^{−y}` on average: `(1 − π)e^{−kh} + π e^{−(k+1)h} = e^{−y}`.
//!    *Claim:* for every `ε` and every random `R` independent of the step,
//!    `E[f_ε(R + Y)] ≤ E[f_ε(R + Ỹ)]`. *Proof:* given `R = r`, `f_ε(r + y) = φ(e^{−y})` with
//!    `φ(v) = (1 − e^{ε−r} v)₊` convex in `v`; `e^{−y}` is the `π`-weighted mean of
//!    `e^{−kh}` and `e^{−(k+1)h}`, so by convexity `φ(e^{−y}) ≤ (1 − π)φ(e^{−kh}) + πφ(e^{−(k+1)h})
//!    = E[f_ε(r + Ỹ) | Y = y]`; take expectations. Replacing the steps one at a time (the others
//!    form `R`) gives `δ_Y(ε) ≤ δ_Ỹ(ε)` for the composition, at every `ε`, for any number of
//!    steps, heterogeneous or not, in either adjacency direction: no concentration argument and
//!    no shift, so the bound's excess over the truth does not grow like `√N·h`; it is of order
//!    `N·h²` (each step's mean moves up by about `h²/12` and its variance by about `h²/6`).
//!    The pmf needs no quadrature: a bin `[kh, (k+1)h]` holding `P`-mass `P_k` and `Q`-mass
//!    `Q_k = E_P[e^{−Y}; bin]` sends `p⁺ = (P_k − e^{kh} Q_k)/(1 − e^{−h})` to `(k+1)h` and
//!    `P_k − p⁺` to `kh` (the two equations `p⁻ + p⁺ = P_k`, `p⁻e^{−kh} + p⁺e^{−(k+1)h} = Q_k`).
//!    Both masses are differences of the exact CDFs (erfc) of the loss under `P` and under `Q`
//!    at the bin edges, the lower or upper tails, whichever is accurate there. (A round-off
//!    error in one edge's CDF moves mass by a second difference around that edge: it shifts no
//!    mean.)
//! 3. **FFT composition.** The characteristic functions of the grid pmfs (real-to-complex
//!    FFTs: only the `n/2 + 1` non-negative frequencies of the real pmfs) are raised to their
//!    counts and multiplied, on a window `[K_lo, K_hi]` of the composed grid chosen by Chernoff
//!    bounds (from the exact log-MGF of each grid pmf, coarsened upward) so that the mass outside
//!    is at most `τ` on each side; the circular wrap-around then adds at most `2τ` of mass, which
//!    is accounted for in both bounds (with the tilt of the round-off section, wrapped mass is
//!    handled there). `δ_Ỹ(ε)` of the discrete composition is evaluated exactly at any real `ε`
//!    (not only on the grid), so the upper bound is `δ_Y(ε) ≤ δ_w(ε) + Σ T_i P(Y_i > b_i) + 2τ`
//!    plus the round-off terms below.
//! 4. **Lower bound** (from the same composed pmf). Given `Y = y`, `D = Ỹ − y` lies in an interval
//!    of width `h` and has conditional mean `m(u) = hπ(u) − u ∈ [0, m*]`,
//!    `m* = max_u m(u) ≤ (h/2 + h²/12)²/2 ≈ h²/8`. By the Azuma–Hoeffding inequality
//!    `P(Σ (D_i − m_i) ≥ t) ≤ η = exp(−2t²/(N h²))`, so `S ≥ S̃ − t − N m*` except with
//!    probability `η`, and `δ_Y(ε) ≥ δ_Ỹ(ε + t + N m*) − η − Σ T_i P(Y_i < a_i) − 2τ`.
//! 5. **Both adjacency directions** (remove: `P` = mixture, `Q` = N(0, σ²); add: swapped) are
//!    composed separately; the reported values are the maxima. Parallel groups are expanded into
//!    the member combinations a record can see, each composed as above; the maximum is reported.
//!
//! 6. **Refinement.** For ε(δ) and δ(ε) a coarse pass (excess 0.3 % of the RDP ε) comes first;
//!    the fine pass then composes the directions (both adjacency directions of every member
//!    combination) in decreasing order of their coarse upper bound, and keeps the coarse
//!    composition of any direction whose coarse upper bound is already at most the largest fine
//!    upper bound found: the reported maximum of certified bounds is unchanged, and that
//!    direction's work is saved (the add direction of the subsampled Gaussian, usually). A
//!    refined direction whose fine bound comes out above its coarse one keeps the coarse one
//!    (both are certified), so a finer accuracy never loosens the bound already certified.
//! 7. **Every query answered.** A pass whose grid would exceed `max_points` is redone on the
//!    coarser grid the limit allows (the first pass), or skipped (the fine pass: the first
//!    pass's certified answer stands); where no PRV grid fits, or the δ error budget is not
//!    small against δ, [`PrvAccountant::epsilon`] returns the RDP bound, and
//!    [`EpsilonBounds::method`] says which computation answered and at which tolerance.
//! 8. **Heavy upper tails, split off.** At small q the remove direction's loss has a rare,
//!    heavy upper tail (a step that samples the record and draws a large output): the saddle
//!    tilt's MGF is then carried by losses far beyond any that matter for δ, its Chernoff
//!    factor lies many orders above δ, and the FFT's round-off, charged relative to it,
//!    loosens the bound (+10 % at q = 1e-4, σ = 0.8, T = 10⁴, δ = 1e-12). Where the steps'
//!    tails above a cut `c` (where `T·P(Y > c) ≈ √τ`) carry at least 1 % of the tilted sum,
//!    one part of the composition has such a tail, and the unsplit composition does not fit or
//!    charges at least 1e-5 of δ for round-off at the expected query point, the direction is
//!    also composed as in the
//!    `split` module: the losses at most `c` (the body, a sub-probability) by the tilted FFT,
//!    the steps above `c` counted — at most one (the body with one step fewer, untilted, read
//!    at ε less that step's loss, which is discretized pessimistically from bracketed exact
//!    tails), two or more bounded by `(T·P(Y > c))²/2`; with one heavy-tailed part and
//!    `T ≥ 2`, exactly two counted too (the tail masses' self-convolution read through the
//!    body less one step) and three or more bounded by `(T·P(Y > c))³/6`, so that the cut
//!    can lie lower and the body stays light. Both compositions certify the
//!    direction; the tighter at the expected query point is kept. The fine pass centres a
//!    split direction on its coarse certified ε, which can lie far above the answer; where
//!    the FFT's charge at the answer then moves ε by more than a tenth of the grid's
//!    tolerance, the direction is composed again centred halfway down to its answer, and the
//!    tighter kept (`PrvAccountant::recentre_split`). The lower bound is the
//!    body's (clamping only lowers the losses).
//!
//! The estimate (not certified) removes the discretization's expected effect from the upper
//! bound: the mean shift `N·s(h)`, `s(h) = h/(1 − e^{−h}) − 1 − h/2 ≈ h²/12`, plus the effect
//! `N (h²/12) R` of the added variance, where `R = δ''(ε)/(−δ'(ε))` is measured on the composed
//! grid by finite differences.
//!
//! # Round-off: what is proven and what is assumed
//!
//! Steps 1–5 are exact statements about grid pmfs that satisfy the split equations exactly.
//! The floating-point computation departs from them in three places, each charged in the bounds:
//! the FFT composition (proven, given an assumed constant of the FFT kernels), the relative
//! round-off of tilting, untilting and the query tables (proven), and the grid pmf's own
//! round-off (proven, given the accuracy of libm's `erfc`, `exp`, `exp_m1`, `ln`, `ln_1p`).
//! The FFT's share is made relative to the tail of the composition, not to its total mass, by
//! an exponential tilt; the pmf's share is relative to δ itself (5).
//!
//! 1. **Tilted composition.** The FFT composes `x_i[k] = p_i[k]·e^{λk}/M_i` (`M_i = Σ_k
//!    p_i[k] e^{λk}`, `λ ≥ 0` per grid index) instead of the grid pmfs `p_i`. Tilting commutes
//!    with convolution: the exact composition of the `x_i` is `w̃_k = w_k e^{λk}/G`,
//!    `G = Π_i M_i^{t_i}`, so `w_k = w̃_k·G·e^{−λk}`. An absolute error `e_k` of the tilted FFT is
//!    an error `e_k·G·e^{−λk}` of `w_k`, and δ(ε) only involves `k ≥ k0` (the first grid index
//!    above ε), where `G·e^{−λk} ≤ G·e^{−λk0}`, the Chernoff bound on `P(S ≥ k0·h)`: the FFT's
//!    error becomes relative to the tail beyond ε (at δ = 1e-12, T = 1000 the untilted error,
//!    ~1e-13, was half of δ). λ is the saddle point whose tilted mean is the expected query
//!    point: a saddle-point estimate of ε(δ) for the coarse pass, each direction's coarse ε for
//!    the fine pass, ε itself for δ(ε) queries. Heavy per-step tails (small q or σ) stretch
//!    the tilted sum far above the untilted window (a few large single-step losses carry much
//!    of the tilted mass): the window may grow fourfold (1.25-fold for a coarse pass) for free,
//!    and up to 64-fold (and a quarter of `max_points`) where halving λ would leave an FFT
//!    round-off above 1e-3 of the tolerance (it is relative to the halved tilt's Chernoff
//!    factor, which can lie far above δ); otherwise λ is halved. Where only the point limit
//!    forced the halving in a fine pass, that pass is also composed on the coarser grid that
//!    keeps the tilt, and the tighter of the two kept. Where the saddle-point estimate lies so
//!    far above the answer that the window's values there were dropped (see 6), the direction
//!    is composed again centred lower (the tangent of `ln δ_w` extrapolated down to δ). Any
//!    λ ≥ 0 is valid; λ only sets the tightness.
//! 2. **Window with a tilt.** Mass above the window wraps to `r = k − jn` amplified by
//!    `e^{λ(k − r)}`: the top of the window is also chosen by a Chernoff bound on the tilted sum
//!    so that `Σ_{k > K_hi} w_k e^{λ(k − k_ref)} ≤ τ` (its untilted mass is then at most τ
//!    too). For the upper bound wrapped mass only adds to `w` (δ_w cannot decrease) and the
//!    mass missing above costs at most τ; the lower bound subtracts `τ·e^{−λ(k0 − k_ref)}`. Mass
//!    below the window wraps damped by `e^{−λ(r − k)} ≤ e^{−λn}`: a pass centred on a known ε
//!    (a fine pass, a δ(ε) query) starts its window 6 tilted standard deviations below `k_ref`
//!    provided `λ·n ≥ ln(1/τ)` (queries below it get the trivial bounds, see 6).
//! 3. **FFT error (proven for an assumed kernel constant).** We assume the standard error
//!    bounds of a Cooley–Tukey FFT with accurate twiddle factors, with constant
//!    `c = FFT_LEVEL_C = 32` per level: normwise `‖fl(Fx) − Fx‖₂ ≤ c·log2(n)·u·‖Fx‖₂` and
//!    componentwise `|fl(Fx)_j − (Fx)_j| ≤ c·log2(n)·u·‖x‖₁` (Higham 2002, §24.1, gives
//!    `c ≈ 5–7` for radix 2; the constants of rustfft's mixed-radix kernels and realfft's
//!    post-processing pass are not published, so `c` is an **assumption**; a unit test finds
//!    the normwise error against an exact DFT below a quarter of it). From
//!    these: per frequency the power's error is at most `t·ε_c·m_j^{t−1}` (mean value theorem
//!    for `z^t` on `|z| ≤ m_j = |X̂_j| + ε_c`), the parts' errors telescope through the product,
//!    the polar evaluation of `z^t` adds a relative `u·(8t + 1600)` (assuming libm's `exp`,
//!    `ln`, `atan2`, `sin`, `cos` within 2 ulp, as glibc documents), and the inverse transform
//!    adds `c·log2(n)·u` times `‖Ẑ‖₂` (normwise) or `‖Ẑ‖₁` (componentwise). This bounds
//!    `‖ŵ − w̃‖₂ ≤ e₂` and `max_k |ŵ_k − w̃_k| ≤ e_∞`, so δ_w moves by at most
//!    `G·e^{−λk0}·min(e₂·(Σ_{j ≥ 0} e^{−2λj})^{1/2}, e_∞·Σ_{j ≥ 0} e^{−λj})`.
//! 4. **Relative round-off (proven).** Tilting (relative error of `e^{λk − ln M_i}` at most
//!    `u(2|λk| + 2|λk − ln M_i| + 6)` per entry, `(1 + ρ)^T` over T non-negative factors),
//!    untilting (an exact exponential every 256 points, stepped by `e^{λ}` in between) and the
//!    query tables (sums of non-negative terms, `≤ 4n·u`) are charged as a factor `1 + rel` on
//!    δ_w.
//! 5. **Grid pmf round-off (proven, given libm's accuracy).** *Assumptions:* the platform
//!    libm's `exp`, `exp_m1`, `ln`, `ln_1p` are within 2 ulp (`LIBM_REL` = 4u relative), and
//!    `libm::erfc` within 4 ulp (`ERFC_REL` = 8u; a unit test finds it within 2 ulp of 20-digit
//!    references); the rest is IEEE arithmetic, round to nearest, u = 2^−53.
//!    - *(a) Edge values.* At a bin edge (the grid value kh, its rounding included) the code
//!      inverts the loss, `x̂ = g⁻¹(y)`, and evaluates both tails from `u0 = fl(x̂/σ)` and
//!      `u1 = fl((x̂ − 1)/σ)`. Both values are within a relative `rel` of the *exact* tails at the
//!      common output `x' = σ·u0`: erfc's error; its argument's roundings through
//!      `|d ln erfc(w)/dw| ≤ 2|w| + 1.5` (Abramowitz–Stegun 7.1.13); the second component's
//!      argument against `(x' − 1)/σ` through `|d ln Φ(ζ)/dζ| ≤ |ζ| + 1.07`; the mixture's
//!      weight, products and sum. The exact loss `ŷ` at `x'` lies within `d` of the edge: a
//!      backward error analysis of the inversion, step by step, through the loss as a function
//!      of `z = (2x − 1)/(2σ²)`, `G(z) = ln(1 − q + qe^z)`, with `G' ∈ (0, 1]` and `ln G'`
//!      1-Lipschitz (`d ≈ 1e-14`; `d ≤ h/4` is checked). Where the inversion runs off the
//!      support (`y ≤ ln(1 − q)`, up to a band of 16u where the exact tails are bounded by an
//!      absolute `abs`) the tails are exactly 0 and 1.
//!    - *(b) Edge sensitivity lemma.* Let `g(k) = e^{−kh}Ψ(e^{kh})` with `Ψ` convex and
//!      non-decreasing on (0, ∞): for `g(k) = E[f_ε(R + kh)]`, `Ψ(v) = E[(v − e^{ε−R})₊]` with
//!      `Ψ'(v) = P(R > ε − ln v) ∈ [0, 1]`; for `g(k) = e^{λk}`, `Ψ(v) = v^{1+λ/h}`. The split
//!      of step 2, done exactly from edge values (P-tail, Q-tail), makes `⟨p, g⟩ = Σ_j P_j g(j) +
//!      p⁺_j Δg_j` a linear function of them (`Δg_j = g(j+1) − g(j)`). A change `(α, β)` of an
//!      interior edge's values changes it by exactly `(β − e^{−y}α)·κ`: the direction
//!      `(1, e^{−y})` (mass moved across the edge) has no effect, and
//!      `κ = (e^{y_e}Δg_e − e^{y_{e−1}}Δg_{e−1})/(1 − a) = [aΨ(v/a) − (1 + a)Ψ(v) + Ψ(av)]/(1 − a)`
//!      (`a = e^{−h}`, `v = e^{y}`), a second difference of the convex `Ψ`:
//!      `0 ≤ κ ≤ v·[Ψ'(v/a) − Ψ'(av)]`, for δ `κ ≤ e^{y}·P(R ∈ [ε − y_{e+1}, ε − y_{e−1}])`. The
//!      errors of the tails are *not* amplified by the split's `1/(1 − e^{−h})`: a pmf entry's
//!      error is, but it is multiplied by an increment of `g`, and neighbouring bins' errors
//!      cancel to a second difference. The end edges (with the clamped masses) obey the same
//!      with one-sided windows `[ε − y_1, ∞)`, `[ε − y_n, ∞)`; at the switch from lower to upper
//!      tails the two values also create mass (`F + S = 1` up to `rel`), costing at most
//!      `(2|m| + e^{y}|m_Q|)·P(R ≥ ε − y_{sw+1})`. Where P's switch (its median) lies far
//!      above Q's median (a large per-step loss: `SEPARATE_Q_SWITCH_ABOVE`), Q's tails switch
//!      at an edge of their own, Q's median: the edges between take P's lower and Q's upper
//!      tail at the same computed point (the lemma holds for each value separately: `α` and
//!      `β` enter linearly, and the bounds take absolute values). P's switch then creates
//!      P-mass only (`2|m|`; its Q-tail term is `e^{y}·rel·Q(Y > y) ≤ rel·e^{d}·P(Y > y)`),
//!      Q's switch Q-mass only (`e^{y_{qsw}}|m_Q|`, through `|∂/∂Q_k| ≤ e^{y}P` of (d)), and
//!      both windows lie inside `[ε − y_{sw+1}, ∞)`; `e^{y_sw}` in the charges below is
//!      replaced by `e^{y_{qsw}} + 2.02`, which covers both switches' terms.
//!    - *(c) Summing over edges.* The common point's shift (`ŷ` instead of the edge) gives
//!      `|e^{y}(β − e^{−y}α)| ≤ (e^d − 1)·P(Y ∈ [y − d, y + d])`; these intervals are disjoint
//!      and a loss in one of them with R in the edge's window has `Ỹ + R ≥ ε − 3h` (`Ỹ ≥ Y − h`):
//!      in all, `(e^d − 1)·P(Ỹ + R ≥ ε − 3h)`. The relative errors of an upper-tail edge give
//!      `rel·(1 + e^d)·P(Y > ŷ)` times its window's probability; each R lies in at most 4
//!      windows: `4·rel_max·(1 + e^d)·P(Ỹ + R ≥ ε − 3h)`. The lower-tail edges and the switch
//!      give `(4·max rel·(F + e^{y}G) + r_sw(3 + 2e^{y_sw}))·P(R ≥ ε − y_{sw+1})`, and
//!      `P(R ≥ ε − y_{sw+1}) ≤ P(Ỹ + R ≥ ε)/π` with `π ≤ P(Ỹ ≥ y_{sw+1})` bounded from the tails
//!      (≈ 1/2: the switch is at the median).
//!    - *(d) Bins.* A bin's two subtractions, the split (`e^{y}Q_k`'s rounding, the subtraction
//!      and division, the clamp to `[0, P_k]`) and the sums into the pmf change `⟨p̂, g⟩` by at
//!      most `m_j·P(R ≥ ε − y_{j+1})` (`|∂/∂P_k| ≤ 2P`, `|∂/∂Q_k| ≤ e^{y}P`,
//!      `|∂/∂p⁺| ≤ (1 − e^{−h})P`); up to `c_rel` times the bin's mass these sum to
//!      `c_rel·P(Ŷ + R ≥ ε − h)`, the rest (none in practice) is charged per grid point with a
//!      Chernoff factor, like the FFT's error (`b` in 6).
//!    - *(e) The composition.* Replacing the exact pmfs by the computed ones one step at a time
//!      (the other steps, exact or computed, form R) gives `|δ_p(ε) − δ_p̂(ε)| ≤ κ·τ(ε − 3h)`
//!      plus the per-point terms, `κ = Σ_i t_i·coef_i` (about `5e-13` per step at T = 1000:
//!      `≈ 4700u`, mostly the far tails' `rel`), where `τ(x)` bounds `P(S ≥ x)` for every such
//!      mixed composition: the smaller of a Chernoff bound and the *δ-trick*
//!      `P(S ≥ x) ≤ δ_S(x − Δ)/(1 − e^{−Δ})` (from `f_{x−Δ}(s) ≥ (1 − e^{−Δ})·1{s ≥ x}`), where
//!      δ_S(x − Δ) is at most the computed composition's certified bound there plus
//!      `κ·Chernoff(x − Δ − 3h)`; `Δ = ln(1 + 1/μ)` (μ the tilt per unit of ε) minimizes
//!      `e^{μΔ}/(1 − e^{−Δ})`. The mixed compositions' Chernoff factor bounds the exact pmfs'
//!      MGF by the computed ones' through the lemma with `Ψ(v) = v^{1+λ/h}`:
//!      `M ≤ M̂(1 + ρ₂)/(1 − ρ₁)` (`PmfRoundoff::mgf_drift`, plus the log-MGF's own rounding).
//!      So the pmf's round-off is charged *relative to δ* (1.4e-8·δ and 5.8e-9·δ measured in
//!      the two δ = 1e-12, T = 1000 golden cases), where the model it replaces charged a random
//!      walk of `1/h`-amplified dipoles relative to the tilt's Chernoff factor (~4e-6 ≫ δ in
//!      the first, +1.2e-4 in ε).
//!    - The clamped tails charged in step 1 are bounded from the exact tails at a point whose
//!      loss is certainly beyond the clamp (8d, or half a bin, inside it).
//! 6. **Charging.** With `b` the sum of the terms of 3 and the per-point terms of 5 at a
//!    reference index `k_ref`, the upper bound is
//!    `(1 + rel)·(δ_w(ε) + 3·b·e^{−λ(k0 − k_ref)} + κ·τ(ε − 3h)) + trunc + 2τ` (the factor 3
//!    covers the rounding of the bound's own evaluation with room), the lower bound subtracts
//!    the same (plus the wrapped mass of 2). Going down from `k_ref`, the window's values below
//!    the first index where the decaying term exceeds 1e-3 of the mass above are dropped: there
//!    the upper bound is 1 and the lower bound 0, valid but loose (queries far below the tilt).
//!    ε(δ) is the ε at which the upper bound meets δ, the decaying terms evaluated at a point
//!    below the answer (their value there bounds them further out); the answer is re-checked
//!    by evaluating the upper bound there.
//!
//! What remains assumed: the FFT kernels' constant (3) and libm's accuracy (3, 5). With the
//! window free to grow where halving the tilt would cost tightness (1), the FFT's term stays
//! small against δ also where heavy per-step tails stretch the tilted sum: at δ = 1e-12,
//! T = 1000, q = 0.01, σ = 1 the tight preset's certified ε is 5.3e-6 above our estimate
//! (8.5e-6 when the tilt was halved to keep the window small), and at δ = 1e-8,
//! q = 0.0005, σ = 0.8, T = 10⁴ the default's is within 2e-5 of the truth (11 % above it
//! then). Both are checked against references (see the crate README).
//!
//! # Grid step
//!
//! The upper bound's excess over the truth is about `E(h) = (N + 1)·h²·(1 + R)/12` (step 2;
//! the `+ 1` covers few-step compositions, where the single step's chord error, up to `h²R/8`
//! between grid points, is not averaged out). For an ε tolerance `t` the grid step is
//! `h = √(12·0.8·t / ((N + 1)(1 + R)))` (aiming at 0.8 of the tolerance), with `R` taken from a
//! Gaussian approximation of `S` for a first, coarse pass (excess 0.3 % of the RDP ε) and then
//! measured on that pass's composed grid for the final one. A relative tolerance is relative to
//! the coarse pass's certified ε. These choices affect only the tightness, never the
//! certificate.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{AccountantError, Result};
use crate::rdp::RdpAccountant;
#[cfg(test)]
use crate::special::norm_pdf;
use crate::special::{norm_cdf, norm_sf, norm_upper_quantile};
use crate::types::{Composition, Delta, Epsilon, SubsampledGaussian};

mod compose;
mod split;
use compose::compose_pmfs;

/// Adjacency direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Direction {
    /// Removing a record: P = (1−q)N(0,σ²) + qN(1,σ²), Q = N(0,σ²).
    Remove,
    /// Adding a record: P = N(0,σ²), Q = (1−q)N(0,σ²) + qN(1,σ²).
    Add,
}

/// How precise ε must be: the estimated excess of the certified upper bound over the true ε.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum EpsTolerance {
    /// `eps_error = rel × scale`, where the scale is a first (coarse) certified ε, at least
    /// [`RELATIVE_FLOOR`] (for ε(δ)), or max(ε, sd of the composed loss) (for δ(ε)).
    Relative(f64),
    /// A fixed `eps_error`.
    Absolute(f64),
}

/// Requested accuracy and resource limits.
///
/// `eps` sets the grid: the certified upper bound is expected to exceed the true ε by about
/// `eps_error` (an estimate of the discretization's effect, see the [module docs](self); the
/// bound itself is certified whatever the accuracy). The certified lower bound is looser (its
/// Hoeffding term grows like `√N·h`). `delta_error` (relative to δ for ε(δ) queries, absolute
/// for δ(ε) queries) is the mass allowed for truncation and wrap-around in the upper bound; the
/// lower bound spends another `delta_error / 2` on its rounding tail.
///
/// | preset | relative `eps_error` | what it buys |
/// |---|---|---|
/// | [`Accuracy::fast`] | 1e-3 | certified ε within about 0.1 % of the truth, ~2× faster than the default |
/// | [`Accuracy::default`] | 1e-4 | certified ε within about 0.01 % of the truth |
/// | [`Accuracy::tight`] | 1e-5 | certified ε within about 0.001 % of the truth, ~2–3× the default's time |
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// ε tolerance.
    pub eps: EpsTolerance,
    /// δ error budget relative to δ (ε(δ) queries).
    pub delta_error_rel: f64,
    /// Absolute δ error budget for δ(ε) queries.
    pub delta_error_abs: f64,
    /// Largest FFT grid (points) allowed per direction; memory is about 40 bytes per point.
    /// All directions and member combinations of one composition together may use at most
    /// twice this (both directions of a single sequential composition fit; the member
    /// combinations of heterogeneous parallel groups share the budget).
    pub max_points: usize,
    /// Largest number of member combinations of parallel groups.
    pub max_combinations: u64,
}

/// Relative ε tolerance of [`Accuracy::default`].
pub const DEFAULT_RELATIVE_EPS_ERROR: f64 = 1e-4;

/// The default relative δ error budget of ε(δ) queries (`delta_error_rel`), the top of the δ
/// budget's ladder (see [`PrvAccountant::epsilon`]).
pub const DEFAULT_DELTA_ERROR_REL: f64 = 1e-5;

impl Default for Accuracy {
    /// Relative `eps_error` 1e-4 (certified ε within about 0.01 % of the truth), δ error budget
    /// 1e-5·δ (ε(δ)) or 1e-15 (δ(ε)), at most 2^23 grid points, 256 member combinations.
    fn default() -> Self {
        Self {
            eps: EpsTolerance::Relative(DEFAULT_RELATIVE_EPS_ERROR),
            delta_error_rel: DEFAULT_DELTA_ERROR_REL,
            delta_error_abs: 1e-15,
            max_points: 1 << 23,
            max_combinations: 256,
        }
    }
}

impl Accuracy {
    /// Relative ε tolerance: the certified upper bound is expected within `rel × ε` of the truth.
    pub fn relative(rel: f64) -> Self {
        Self {
            eps: EpsTolerance::Relative(rel),
            ..Self::default()
        }
    }

    /// Absolute ε tolerance.
    pub fn absolute(eps_error: f64) -> Self {
        Self {
            eps: EpsTolerance::Absolute(eps_error),
            ..Self::default()
        }
    }

    /// Preset "fast": relative `eps_error` 1e-3 (certified ε within about 0.1 % of the truth).
    pub fn fast() -> Self {
        Self::relative(1e-3)
    }

    /// Preset "tight": relative `eps_error` 1e-5 (certified ε within about 0.001 % of the
    /// truth, as tight as dp_accounting's PLD at a 1e-5 grid).
    pub fn tight() -> Self {
        Self::relative(1e-5)
    }

    /// Set the relative δ error budget (ε(δ) queries).
    pub fn with_delta_error_rel(mut self, rel: f64) -> Self {
        self.delta_error_rel = rel;
        self
    }

    /// Set the grid limit.
    pub fn with_max_points(mut self, max_points: usize) -> Self {
        self.max_points = max_points;
        self
    }

    fn validate(&self) -> Result<()> {
        let (name, v) = match self.eps {
            EpsTolerance::Relative(v) => ("eps_error (relative)", v),
            EpsTolerance::Absolute(v) => ("eps_error (absolute)", v),
        };
        if !(v.is_finite() && v > 0.0) {
            return Err(AccountantError::InvalidAccuracy {
                name,
                value: v,
                reason: "must be positive and finite",
            });
        }
        let r = self.delta_error_rel;
        if !(r.is_finite() && r > 0.0 && r < 1.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "delta_error_rel",
                value: r,
                reason: "must lie in (0, 1)",
            });
        }
        let a = self.delta_error_abs;
        if !(a.is_finite() && a > 0.0 && a < 1.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "delta_error_abs",
                value: a,
                reason: "must lie in (0, 1)",
            });
        }
        if self.max_points < 16 {
            return Err(AccountantError::InvalidAccuracy {
                name: "max_points",
                value: self.max_points as f64,
                reason: "must be at least 16",
            });
        }
        Ok(())
    }
}

/// ε(δ): certified upper bound, estimate and lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpsilonBounds {
    /// Certified upper bound (report this).
    pub upper: f64,
    /// Estimate (not certified): the upper bound less the discretization's estimated excess.
    pub estimate: f64,
    /// Certified lower bound.
    pub lower: f64,
    /// Certified upper bound for the remove direction alone. A direction whose coarse-pass
    /// bound is already at most `upper` is not refined ([module docs](self)): its value here is
    /// then the coarse pass's, certified but looser.
    pub upper_remove: f64,
    /// Certified upper bound for the add direction alone (the coarse pass's where that
    /// direction cannot set `upper`, as for `upper_remove`).
    pub upper_add: f64,
    /// How `upper` was certified.
    #[serde(default)]
    pub method: Method,
}

impl EpsilonBounds {
    /// The tighter of two certified answers to the same query: the smaller upper bound of each
    /// direction (and overall), the larger certified lower bound, and this answer's estimate
    /// capped at the upper bound.
    fn tightest(&self, other: &EpsilonBounds) -> EpsilonBounds {
        let upper = self.upper.min(other.upper);
        EpsilonBounds {
            upper,
            estimate: self.estimate.min(upper),
            lower: self.lower.max(other.lower).min(upper),
            upper_remove: self.upper_remove.min(other.upper_remove),
            upper_add: self.upper_add.min(other.upper_add),
            method: if other.upper < self.upper {
                other.method
            } else {
                self.method
            },
        }
    }
}

/// How a certified ε was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Method {
    /// The PRV accountant on a grid built for this absolute ε tolerance (the estimated excess
    /// of the upper bound over the truth). It is larger than the requested one where the
    /// requested grid would exceed `max_points`.
    Prv {
        /// The absolute ε tolerance of the grid that answered.
        eps_error: f64,
    },
    /// The RDP bound at this order (certified but looser: no PRV grid fitted `max_points`, or
    /// the δ error budget was not small against δ); the lower bound is then 0.
    Rdp {
        /// The Rényi order that gave the bound.
        order: f64,
    },
}

impl Default for Method {
    fn default() -> Self {
        Self::Prv {
            eps_error: f64::NAN,
        }
    }
}

/// δ(ε): certified upper bound, estimate and lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeltaBounds {
    /// Certified upper bound (report this).
    pub upper: f64,
    /// Estimate (not certified): δ of the discrete composition at ε shifted up by its estimated
    /// excess.
    pub estimate: f64,
    /// Certified lower bound.
    pub lower: f64,
}

// ---------------------------------------------------------------------------------------------
// The privacy loss of one step.

#[derive(Debug, Clone, Copy)]
struct Loss {
    q: f64,
    sigma: f64,
    dir: Direction,
}

impl Loss {
    /// Remove-direction loss as a function of the output x: ln(1 − q + q·e^{(2x−1)/(2σ²)}).
    fn g(&self, x: f64) -> f64 {
        let z = (2.0 * x - 1.0) / (2.0 * self.sigma * self.sigma);
        if self.q == 1.0 {
            z
        } else if z > 0.0 {
            z + self.q.ln() + ((1.0 - self.q) / self.q * (-z).exp()).ln_1p()
        } else {
            (self.q * z.exp_m1()).ln_1p()
        }
    }

    /// Inverse of `g` (−∞ at or below ln(1−q)); [`Self::ginv_err`] is the same computation
    /// with its error bound.
    #[cfg(test)]
    fn ginv(&self, y: f64) -> f64 {
        let s2 = self.sigma * self.sigma;
        let z = if self.q == 1.0 {
            y
        } else if y > 0.0 {
            y - self.q.ln() + (-(1.0 - self.q) * (-y).exp()).ln_1p()
        } else {
            let r = y.exp_m1() / self.q;
            if r <= -1.0 {
                f64::NEG_INFINITY
            } else {
                r.ln_1p()
            }
        };
        s2 * z + 0.5
    }

    /// Grid-free support [a, b] with P(Y < a) ≤ mass/… and P(Y > b) ≤ mass.
    fn support(&self, mass: f64) -> (f64, f64) {
        let z = norm_upper_quantile(mass);
        let s = self.sigma;
        match self.dir {
            Direction::Remove => (self.g(-s * z), self.g(1.0 + s * z)),
            Direction::Add => (-self.g(s * z), -self.g(-s * z)),
        }
    }

    /// (lower CDF F(y), upper tail S(y)); only the one asked for is computed accurately.
    /// `upper == false` → returns F(y); `upper == true` → returns S(y).
    #[cfg(test)]
    fn tail(&self, y: f64, upper: bool) -> f64 {
        let (q, s) = (self.q, self.sigma);
        match self.dir {
            Direction::Remove => {
                let x = self.ginv(y);
                if x == f64::NEG_INFINITY {
                    return if upper { 1.0 } else { 0.0 };
                }
                if upper {
                    (1.0 - q) * norm_sf(x / s) + q * norm_sf((x - 1.0) / s)
                } else {
                    (1.0 - q) * norm_cdf(x / s) + q * norm_cdf((x - 1.0) / s)
                }
            }
            Direction::Add => {
                let x = self.ginv(-y);
                if x == f64::NEG_INFINITY {
                    return if upper { 0.0 } else { 1.0 };
                }
                if upper {
                    norm_cdf(x / s)
                } else {
                    norm_sf(x / s)
                }
            }
        }
    }

    /// The tails of Y under P (its law) and under Q, with one inversion of the loss:
    /// `(P(Y ≤ y), Q(Y ≤ y))` for `upper == false`, `(P(Y > y), Q(Y > y))` for `upper == true`,
    /// where `Q(Y ∈ A) = E_P[e^{−Y}; Y ∈ A]` (the pair is mutually absolutely continuous).
    #[cfg(test)]
    fn tails_pq(&self, y: f64, upper: bool) -> (f64, f64) {
        let t = self.edge_tails(y, upper);
        (t.p, t.q)
    }

    /// `g⁻¹(y)` as [`Self::ginv`] computes it, with a bound on its backward error (module docs,
    /// round-off, 5): `(x̂, d, abs)`. For finite `x̂`, the exact loss at `x' = σ·fl(x̂/σ)` (the
    /// common point of the tails) lies within `d` of the real number `y` was rounded from
    /// (`|y − y_exact| ≤ u|y|` included). `x̂ = −∞` means `y_exact` is at or below the infimum
    /// `ln(1 − q)` of the loss (tails exactly 0 / 1) when `abs == 0`, or that it may lie just
    /// above it (`1 + (e^{y_exact} − 1)/q ≤ 16u`), where the exact tails are at most `abs`.
    fn ginv_err(&self, y: f64) -> (f64, f64, f64) {
        let (u, l) = (UNIT_ROUNDOFF, LIBM_REL);
        let (q, s) = (self.q, self.sigma);
        let s2 = s * s;
        // z = the computed (2x − 1)/(2σ²) and a bound on |G(z) − y|, G(z) = ln(1 − q + q e^z)
        // the loss as a function of z (G' ∈ (0, 1], ln G' 1-Lipschitz).
        let (z, dg) = if q == 1.0 {
            (y, 0.0)
        } else if y > 0.0 {
            // z = (y − ln q) + ln_1p(w), w = −(1 − q)e^{−y}; G'(z*) = 1 + w.
            let lq = q.ln();
            let a1 = y - lq;
            let w = -(1.0 - q) * (-y).exp();
            let l1 = w.ln_1p();
            let z = a1 + l1;
            let tw = l + 2.01 * u;
            let den = 1.0 + w - tw * w.abs();
            if den <= 0.0 || den.is_nan() {
                return (f64::NAN, f64::INFINITY, 0.0);
            }
            let dz = u * z.abs() + u * a1.abs() + l * lq.abs() + l * l1.abs() + tw * w.abs() / den;
            let gp = (1.0 + w + tw * w.abs()).min(1.0);
            (z, dz * gp * exp_up(dz))
        } else {
            // z = ln_1p(r), r = expm1(y)/q ∈ (−1, 0]; G'(z*) = q(1 + r*)e^{−y}.
            let r = y.exp_m1() / q;
            // Relative error of r against expm1(y_exact)/q (libm, the division, y's rounding).
            let tr = l + 2.02 * u;
            if r <= -1.0 - 16.0 * u {
                return (f64::NEG_INFINITY, 0.0, 0.0);
            }
            let rs = r.abs() / (1.0 - tr);
            let den = 1.0 + r - tr * rs;
            if r <= -1.0 || den <= 0.0 || den.is_nan() {
                // 1 + r_exact ≤ 16u: the output lies below 0.5 + σ² ln(16u).
                let xb = 0.5 + s2 * (16.0 * u).ln();
                return (f64::NEG_INFINITY, 0.0, 1.01 * norm_cdf(xb / s) + 1e-300);
            }
            let z = r.ln_1p();
            let dz = l * z.abs() + tr * rs / den;
            // e^{−y} = 1/(1 + q·r*), r* within tr·rs of r (1 + q·r* ≥ 1 − q > 0).
            let gp =
                (q * (1.0 + r + tr * rs) / (1.0 + q * r - q * tr * rs) * (1.0 + 8.0 * u)).min(1.0);
            (z, dz * gp * exp_up(dz))
        };
        let x = s2 * z + 0.5;
        // |z' − z| for z' = (x' − 1/2)/σ² (x̂'s two roundings, x' = x̂(1 + θ)), through G' ≤ 1.
        let d = dg + 2.01 * u * z.abs() + 2.0 * u * x.abs() / s2 + u * y.abs();
        (x, 1.01 * d, 0.0)
    }

    /// The tails of [`Self::tails_pq`] at the (rounded) grid value `y`, with rigorous error
    /// bounds (module docs, round-off, 5).
    fn edge_tails(&self, y: f64, upper: bool) -> EdgeTails {
        let (q, s) = (self.q, self.sigma);
        let u = UNIT_ROUNDOFF;
        let yy = match self.dir {
            Direction::Remove => y,
            Direction::Add => -y,
        };
        let (x, d, abs) = self.ginv_err(yy);
        if x == f64::NEG_INFINITY {
            // Remove: Y ≤ y is impossible; add: certain (Y = −g(X) < −ln(1 − q)).
            let v = match (self.dir, upper) {
                (Direction::Remove, true) | (Direction::Add, false) => 1.0,
                _ => 0.0,
            };
            return EdgeTails {
                p: v,
                q: v,
                rel: 0.0,
                abs,
                d: 0.0,
            };
        }
        if !(x.is_finite() && d.is_finite()) {
            return EdgeTails {
                p: f64::NAN,
                q: f64::NAN,
                rel: f64::INFINITY,
                abs: f64::INFINITY,
                d: f64::INFINITY,
            };
        }
        let (u0, u1) = (x / s, (x - 1.0) / s);
        // A normal tail 0.5·erfc(±v/√2) at the computed v against the exact tail at v: erfc's
        // own error and its argument's two roundings (|Δw| ≤ 2.01u|w|) through
        // |d ln erfc(w)/dw| ≤ 2|w| + 1.5.
        let comp = |v: f64| {
            let w = v.abs() / std::f64::consts::SQRT_2;
            let dw = 2.01 * u * w;
            ERFC_REL + 1.01 * dw * (2.0 * (w + dw) + 1.5)
        };
        // The second component's argument against (x' − 1)/σ, through |d ln Φ(ζ)/dζ| ≤ |ζ| + 1.07.
        let d1 = (2.01 * u * (x - 1.0).abs() + u * x.abs()) / s;
        let rel0 = comp(u0);
        let rel1 = comp(u1) + 1.01 * d1 * (u1.abs() + d1 + 1.07);
        // The mixture (1 − q)·T0 + q·T1: the weight's rounding, two products and the sum.
        let rel = 1.01 * ((rel0 + 2.01 * u).max(rel1 + u) + u);
        let (p, qq) = match (self.dir, upper) {
            // Y = g(X), increasing in the output X; P = mixture, Q = N(0, σ²).
            (Direction::Remove, true) => {
                let q0 = norm_sf(u0);
                ((1.0 - q) * q0 + q * norm_sf(u1), q0)
            }
            (Direction::Remove, false) => {
                let q0 = norm_cdf(u0);
                ((1.0 - q) * q0 + q * norm_cdf(u1), q0)
            }
            // Y = −g(X): Y ≤ y ⇔ X ≥ g⁻¹(−y); P = N(0, σ²), Q = mixture.
            (Direction::Add, true) => {
                let p0 = norm_cdf(u0);
                (p0, (1.0 - q) * p0 + q * norm_cdf(u1))
            }
            (Direction::Add, false) => {
                let p0 = norm_sf(u0);
                (p0, (1.0 - q) * p0 + q * norm_sf(u1))
            }
        };
        EdgeTails {
            p,
            q: qq,
            rel,
            abs: 0.0,
            d,
        }
    }

    /// Rough median of Y (where to switch from F to S for accuracy).
    fn median_guess(&self) -> f64 {
        match self.dir {
            Direction::Remove => self.g(self.q),
            Direction::Add => -self.g(0.0),
        }
    }

    /// Rough median of Y under Q (where Q's tails switch from F to S where that is apart
    /// from P's median, see [`SEPARATE_Q_SWITCH_ABOVE`]).
    fn q_median_guess(&self) -> f64 {
        match self.dir {
            Direction::Remove => self.g(0.0),
            Direction::Add => -self.g(self.q),
        }
    }
}

/// Where P's switch from lower to upper tails (its median) lies above this loss, Q's tails
/// switch on their own, at Q's median (below P's): between the two medians Q's lower tail is
/// close to 1, so bin Q-masses taken as its differences would carry an absolute error of
/// about `u`, and the split multiplies a Q-mass by `e^{y}` (up to `e^{30}` for one step of
/// σ = 0.13 without subsampling; the round-off bound then refused such a pmf). Below it the
/// switches coincide (`e^{y}` is small at P's median and the pmfs stay as they were).
const SEPARATE_Q_SWITCH_ABOVE: f64 = 4.0;

/// The P- and Q-tails of the loss at one bin edge, as computed, with their error bounds
/// (module docs, round-off, 5).
#[derive(Debug, Clone, Copy)]
struct EdgeTails {
    /// P-tail (lower: P(Y ≤ y); upper: P(Y > y)).
    p: f64,
    /// Q-tail (lower: Q(Y ≤ y); upper: Q(Y > y)).
    q: f64,
    /// Both values are within a relative `rel` of the exact tails at a common output `x'`...
    rel: f64,
    /// ...or (`abs > 0`, at the end of the support) within `abs` of the exact tails at `y`.
    abs: f64,
    /// The exact loss at `x'` lies within `d` of the exact grid value.
    d: f64,
}

/// The round-off summary of one step's computed grid pmf `p̂` against the exact pessimistic
/// pmf `p` (module docs, round-off, 5). For every non-negative measure `R` on the grid (the
/// other steps), with `g(k) = E[f_ε(R + kh)]`:
/// `|⟨p − p̂, g⟩| ≤ tail_coef·τ(ε − 3h) + Σ_{(k, m) ∈ abs} m·P(R ≥ ε − kh)`, where τ(x) bounds
/// the tail `P(S ≥ x)` of every composition of the steps' exact or computed pmfs.
#[derive(Debug, Clone)]
struct PmfRoundoff {
    /// The largest backward error `d` of the edges' common points.
    d: f64,
    /// The largest relative error of the upper-tail edges above the switch.
    r_up: f64,
    /// The largest `rel·(F + e^{y}G)` of the lower-tail edges below the switch.
    x_low: f64,
    /// The relative error at the switch between lower and upper tails, and `e^{y}` there
    /// (where Q's tails switch at an edge of their own below P's switch: the largest relative
    /// error of both switch edges, and `e^{y}` at Q's switch plus 2.02, which covers the
    /// Q-tail term `e^{y}·rel·Q(Y > y) ≤ 1.01·rel` at P's switch; module docs, round-off,
    /// 5(b)).
    r_sw: f64,
    e_sw: f64,
    /// A lower bound on `P(Ỹ ≥ y_m)` (the exact pmf's mass above an edge m at most 3 below
    /// `sw + 1`), and `sw + 1 − m`.
    pi_sw: f64,
    sw_gap: f64,
    /// Per unit of a bin's P-mass, the bound on its split's rounding effect (the relative part).
    c_rel: f64,
    /// `(grid index k, mass m)`: the remaining per-bin and per-edge terms.
    abs: Vec<(i64, f64)>,
    /// The coefficient of τ(ε − 3h).
    tail_coef: f64,
}

impl PmfRoundoff {
    /// `(ρ₁, ρ₂)` with `|M − M̂| ≤ ρ₁·M + ρ₂·M̂` for the exact and computed MGFs
    /// `M(λ) = Σ p_k e^{λk}` at the tilt `λ` (per grid index; `ln_m` = ln M̂): the same bound
    /// for the weight `g(k) = e^{λk}` (`Ψ(v) = v^{1+μ}`, `μ = λ/h`), so that
    /// `M ≤ M̂(1 + ρ₂)/(1 − ρ₁)` (module docs, round-off, 5).
    fn mgf_drift(&self, lambda: f64, h: f64, omeh: f64, ln_m: f64) -> (f64, f64) {
        let u = UNIT_ROUNDOFF;
        let mu = lambda / h;
        let nu = lambda.exp_m1() / omeh;
        let el = lambda.exp();
        let ed = self.d.exp();
        let shift = self.d.exp_m1() * (1.0 + mu) * (2.0 * lambda + lambda * self.d / h).exp();
        let upper =
            self.r_up * (1.0 + ed) * (1.0 + mu) * (el + 2.0) * (lambda * (1.0 + self.d / h)).exp();
        // (M ≥ e^{λ k_m}·π, so e^{λ k_{sw+1}}/M ≤ e^{λ·gap}/π.)
        let low = (3.0 * self.x_low * (1.0 + mu) / el
            + self.r_sw * ((1.0 + self.e_sw) * (1.0 + mu) + (1.0 + (1.0 + self.e_sw) * nu) / el))
            * (lambda * self.sw_gap).exp()
            / self.pi_sw;
        let rho1 = 1.01 * (shift + upper + low);
        let w = 1.0_f64.max(nu).max(1.0 + mu);
        let mut a = 0.0_f64;
        for &(k, m) in &self.abs {
            a += m * (lambda * k as f64 - ln_m).exp();
        }
        let rho2 = 1.01 * (w * a + 1.0_f64.max(nu) * self.c_rel * (1.0 + 3.0 * u) * el);
        (rho1, rho2)
    }
}

/// The pessimistic ("connect the dots") pmf of one step's clamped loss on the grid `k·h`.
#[derive(Debug, Clone)]
struct GridPmf {
    offset: i64,
    p: Vec<f64>,
    /// An upper bound on P(Y > b'): the clamp moved this mass down.
    trunc_upper: f64,
    /// An upper bound on P(Y < a'): the clamp moved this mass up.
    trunc_lower: f64,
    /// The round-off of `p` (module docs, round-off, 5).
    roundoff: PmfRoundoff,
}

/// An upper bound on `e^x` for `x ≥ 0` without a libm call where `x` is small
/// (`e^x ≤ 1 + 2x` for `0 ≤ x ≤ 1`).
fn exp_up(x: f64) -> f64 {
    if x <= 1.0 {
        1.0 + 2.0 * x
    } else {
        x.exp() * (1.0 + 1e-12)
    }
}

/// The unit round-off of f64 (2^−53).
const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;

/// Assumed relative accuracy of the platform libm's `exp`, `exp_m1`, `ln` and `ln_1p` (2 ulp;
/// glibc documents at most 1–2 ulp for these on x86_64): an assumption of the round-off bounds.
const LIBM_REL: f64 = 4.0 * UNIT_ROUNDOFF;

/// Assumed relative accuracy of `libm::erfc` (4 ulp; a unit test finds it within 2 ulp of
/// 20-digit references): an assumption of the round-off bounds.
const ERFC_REL: f64 = 8.0 * UNIT_ROUNDOFF;

/// The pessimistic split of a bin `[y0, y0 + h]` with computed `P`-mass `pm` and `Q`-mass
/// `qm`: `(p⁻, p⁺, m)` at `(y0, y0 + h)` with `p⁻ + p⁺ = pm` and
/// `p⁻e^{−y0} + p⁺e^{−y0−h} = qm` (`omeh = 1 − e^{−h}`), `p⁺` clamped to `[0, pm]`, and `m` a
/// bound on the effect of the split's rounding (and the clamp, and the later sums into the
/// pmf) on `⟨p̂, g⟩` per unit of `P(R ≥ ε − y0 − h)` (module docs, round-off, 5), against the
/// exact split of the same masses.
fn split_bin(y0: f64, pm: f64, qm: f64, omeh: f64) -> (f64, f64, f64) {
    let (u, l) = (UNIT_ROUNDOFF, LIBM_REL);
    // `scaled` = e^{y0}·qm, with its relative error against the exact e^{y0}·qm (y0's rounding
    // included): directly, or in log space where e^{y0} alone would overflow.
    let (scaled, ts) = if y0 < 700.0 {
        (y0.exp() * qm, l + 1.01 * u * y0.abs() + u)
    } else if qm > 0.0 {
        let lq = qm.ln();
        (
            (y0 + lq).exp(),
            l + 1.01 * (u * y0.abs() + l * lq.abs() + u * (y0 + lq).abs()),
        )
    } else {
        (0.0, 0.0)
    };
    // e^{y0}|qm| (also where a negative qm was dropped in log space).
    let eq = if y0 >= 700.0 && qm < 0.0 {
        ((y0 + (-qm).ln()).exp() * (1.0 + 1e-9)).min(f64::MAX)
    } else {
        scaled.abs() * (1.0 + 2.0 * ts)
    };
    if pm <= 0.0 {
        // No mass: the exact split of (pm, qm) would put pm at y0 and (pm − e^{y0}qm)/omeh
        // on top: its effect is at most 2|pm| + e^{y0}|qm| per unit.
        return (0.0, 0.0, 2.01 * pm.abs() + 1.01 * eq);
    }
    let raw = (pm - scaled) / omeh;
    let hi = raw.clamp(0.0, pm);
    let lo = pm - hi;
    // The two masses' subtractions (2|Δpm| + e^{y0}|Δqm|), e^{y0}qm's rounding, the split's
    // subtraction and division (and omeh's libm error), the clamp, lo's subtraction, and the
    // sums of lo and hi into the pmf.
    let m = 2.01 * u * pm
        + 1.01 * u * eq
        + 1.02 * ts * eq
        + 1.01 * (2.0 * u + l) * omeh * raw.abs()
        + omeh * (hi - raw).abs()
        + 1.01 * u * lo
        + u * (lo + hi);
    (lo, hi, m)
}

fn build_pmf(
    loss: Loss,
    h: f64,
    tail_mass: f64,
    max_points: usize,
    eps_error: f64,
) -> Result<GridPmf> {
    build_pmf_capped(loss, h, tail_mass, max_points, eps_error, None)
}

/// [`build_pmf`] restricted to the loss at most `cap·h` (a sub-probability: the mass above
/// the cap is dropped, not clamped, where `cap` is given; the support's top is the cap where
/// that is below it). Against the clamped pmf the computed entries differ only by the top
/// edge's tail `P(Y > cap·h)` as computed, whose error the caller charges.
fn build_pmf_capped(
    loss: Loss,
    h: f64,
    tail_mass: f64,
    max_points: usize,
    eps_error: f64,
    cap: Option<i64>,
) -> Result<GridPmf> {
    build_pmf_inner(
        loss,
        h,
        tail_mass,
        max_points,
        eps_error,
        &|y, upper| loss.edge_tails(y, upper),
        cap,
    )
}

/// [`build_pmf`] with the edge tails (and their error bounds) from `tails` (tests perturb them).
#[cfg(test)]
fn build_pmf_with(
    loss: Loss,
    h: f64,
    tail_mass: f64,
    max_points: usize,
    eps_error: f64,
    tails: &(dyn Fn(f64, bool) -> EdgeTails + Sync),
) -> Result<GridPmf> {
    build_pmf_inner(loss, h, tail_mass, max_points, eps_error, tails, None)
}

/// [`build_pmf_capped`] with the edge tails from `tails`.
fn build_pmf_inner(
    loss: Loss,
    h: f64,
    tail_mass: f64,
    max_points: usize,
    eps_error: f64,
    tails: &(dyn Fn(f64, bool) -> EdgeTails + Sync),
    cap: Option<i64>,
) -> Result<GridPmf> {
    let u = UNIT_ROUNDOFF;
    let (a, b) = loss.support(tail_mass);
    if !(a.is_finite() && b.is_finite()) {
        return Err(AccountantError::NumericalFailure("loss support"));
    }
    let a_idx = (a / h).floor();
    let mut b_idx = (b / h).ceil();
    if let Some(c) = cap {
        b_idx = b_idx.min(c as f64);
    }
    // At least 3 bins: the switch below is at most two edges below the top.
    let b_idx = b_idx.max(a_idx + 3.0);
    let nbins = b_idx - a_idx;
    if nbins + 1.0 > max_points as f64 {
        return Err(grid_too_large(nbins + 1.0, max_points, eps_error));
    }
    let (a_idx, nbins) = (a_idx as i64, nbins as usize);
    let edge = |e: usize| (a_idx + e as i64) as f64 * h;
    // Bins whose left edge is below `switch` use the lower tails (accurate there), the others
    // the upper tails (the switch at most at edge nbins − 2, see `pi_sw`).
    let med = loss.median_guess();
    let switch = ((med / h).floor() as i64 - a_idx).clamp(0, nbins as i64 - 2) as usize;
    // Q's tails switch at Q's median where P's switch lies far above it (edges in
    // [q_switch, switch) take P's lower tail and Q's upper tail at the same computed point);
    // elsewhere at P's switch.
    let q_switch = if edge(switch) > SEPARATE_Q_SWITCH_ABOVE {
        let qmed = loss.q_median_guess();
        ((qmed / h).floor() as i64 - a_idx).clamp(0, switch as i64) as usize
    } else {
        switch
    };
    let mixed = |e: usize| -> EdgeTails {
        let lo = tails(edge(e), false);
        let up = tails(edge(e), true);
        EdgeTails {
            p: lo.p,
            q: up.q,
            rel: lo.rel.max(up.rel),
            abs: lo.abs.max(up.abs),
            d: lo.d.max(up.d),
        }
    };
    // (P, Q) tails at every bin edge with their error bounds, computed once and shared by the
    // two bins meeting there; the switch edge also in lower tails (for the bin below it, or the
    // clamped mass at the bottom if it is the bottom edge), and so is Q's switch edge where it
    // is apart.
    let edge_vals: Vec<EdgeTails> = (0..=nbins)
        .into_par_iter()
        .map(|e| {
            if e >= q_switch && e < switch {
                mixed(e)
            } else {
                tails(edge(e), e >= switch)
            }
        })
        .collect();
    let low_sw = tails(edge(switch), false);
    // (At the bottom edge there is no bin below: Q takes upper tails throughout.)
    let low_qsw = (0 < q_switch && q_switch < switch).then(|| tails(edge(q_switch), false));
    let omeh = -(-h).exp_m1();
    // (p⁻, p⁺, rounding bound m) per bin: P-masses from lower tails below `switch`, Q-masses
    // from lower tails below `q_switch` (upper tails above each).
    let bins: Vec<(f64, f64, f64)> = (0..nbins)
        .into_par_iter()
        .map(|j| {
            let t0 = &edge_vals[j];
            let t1 = &edge_vals[j + 1];
            let pm = if j >= switch {
                t0.p - t1.p
            } else if j + 1 == switch {
                low_sw.p - t0.p
            } else {
                t1.p - t0.p
            };
            let qm = if j >= q_switch {
                t0.q - t1.q
            } else if j + 1 == q_switch {
                low_qsw.as_ref().map_or(low_sw.q, |l| l.q) - t0.q
            } else {
                t1.q - t0.q
            };
            split_bin(edge(j), pm, qm, omeh)
        })
        .collect();
    let bottom = if switch == 0 { low_sw } else { edge_vals[0] };
    let top = edge_vals[nbins];
    let mut p = vec![0.0_f64; nbins + 1];
    p[0] = bottom.p;
    // (Capped: the mass above the cap is not kept at all, see `build_pmf_capped`.)
    let dropped = cap.is_some_and(|c| c as f64 == b_idx);
    p[nbins] = if dropped { 0.0 } else { top.p };
    // Relative part of the bins' rounding per unit P-mass (module docs): covers every bin
    // whose masses are consistent (e^{y0}qm ≤ pm); the rest goes to `abs`.
    let y_max = edge(0).abs().max(edge(nbins).abs());
    let c_rel = u * (16.0 + 7.0 * omeh + 1.1 * y_max);
    let mut abs: Vec<(i64, f64)> = Vec::new();
    for (j, (lo, hi, m)) in bins.into_iter().enumerate() {
        p[j] += lo;
        p[j + 1] += hi;
        let rel = c_rel * (lo + hi) / (1.0 - u);
        if m > rel {
            abs.push((a_idx + j as i64 + 1, m - rel));
        }
    }
    // Edge terms.
    let mut d = 0.0_f64;
    let mut r_up = 0.0_f64;
    let mut x_low = 0.0_f64;
    let mut edge_term = |e: usize, t: &EdgeTails| {
        d = d.max(t.d);
        if t.abs > 0.0 {
            abs.push((a_idx + e as i64 + 1, t.abs * (3.0 + 2.0 * edge(e).exp())));
        }
        if e > switch {
            r_up = r_up.max(t.rel);
        } else if e < switch {
            x_low = x_low.max(t.rel * (t.p + edge(e).exp() * t.q) / (1.0 - t.rel));
        }
    };
    for (e, t) in edge_vals.iter().enumerate() {
        edge_term(e, t);
    }
    edge_term(switch, &low_sw);
    let (r_sw, e_sw) = match &low_qsw {
        None if q_switch < switch => (
            low_sw
                .rel
                .max(edge_vals[switch].rel)
                .max(edge_vals[q_switch].rel),
            2.02,
        ),
        None => (
            low_sw.rel.max(edge_vals[switch].rel),
            edge(switch).exp() * (1.0 + 1e-12),
        ),
        Some(l) => {
            edge_term(q_switch, l);
            (
                low_sw
                    .rel
                    .max(edge_vals[switch].rel)
                    .max(l.rel)
                    .max(edge_vals[q_switch].rel),
                edge(q_switch).exp() * (1.0 + 1e-12) + 2.02,
            )
        }
    };
    // π ≤ P(Ỹ ≥ y_m) for the best m ∈ [sw − 2, sw + 1] (then P(R ≥ ε − y_{sw+1}) ≤
    // P(Ỹ + R ≥ ε − 3h)/π): 1 at m = 0, else from the exact tails at edge m + 1, whose common
    // point's loss lies above y_m (d < h).
    let (mut pi_sw, mut sw_gap) = (0.0_f64, 0.0_f64);
    for m in switch.saturating_sub(2)..=(switch + 1).min(nbins - 1) {
        let pi = if m == 0 {
            1.0
        } else {
            let t = &edge_vals[m + 1];
            if m + 1 >= switch {
                t.p / (1.0 + t.rel) - t.abs
            } else {
                1.0 - t.p / (1.0 - t.rel) - t.abs
            }
        };
        if pi > pi_sw {
            pi_sw = pi;
            sw_gap = (switch + 1 - m) as f64;
        }
    }
    // The clamped tails P(Y < y_0) ≤ P(Y ≤ y_0) and P(Y > y_n), bounded by the exact tails at
    // a common point whose loss is certainly beyond the edge: the tails at y' = y_0 + 8d
    // (y_n − 8d) when their own backward error d' is at most 5.8d (y' lies at least 5.9d beyond
    // the exact edge: d ≥ u|y| covers the roundings of y_0 and y'); else half a bin inside
    // (d ≤ h/4 there).
    // Exact where the inversion ran off the support.
    let clamped = |e: usize, t: &EdgeTails, upper: bool| -> (f64, f64) {
        if t.rel == 0.0 && t.d == 0.0 {
            return (t.p + t.abs, 0.0);
        }
        let dir = if upper { -1.0 } else { 1.0 };
        let near = tails(edge(e) + dir * 8.0 * t.d, upper);
        let c = if near.d <= 5.8 * t.d {
            near
        } else {
            tails(edge(e) + dir * 0.5 * h, upper)
        };
        ((c.p / (1.0 - c.rel) + c.abs) * (1.0 + 2.0 * u), c.d)
    };
    let (trunc_lower, dl) = clamped(0, &bottom, false);
    let (trunc_upper, du) = clamped(nbins, &top, true);
    d = d.max(dl).max(du);
    if !(d <= 0.25 * h && pi_sw > 0.0) {
        return Err(AccountantError::NumericalFailure("grid pmf round-off"));
    }
    if std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some() {
        eprintln!(
            "pmf {:?} h={h:e}: trunc {trunc_lower:e} {trunc_upper:e} d {d:e} r_up {r_up:e} x_low {x_low:e} r_sw {r_sw:e} pi_sw {pi_sw} abs {}",
            loss.dir,
            abs.len()
        );
    }
    let ed = d.exp();
    let tail_coef = 1.01
        * (d.exp_m1()
            + 4.0 * r_up * (1.0 + ed)
            + (4.0 * x_low + r_sw * (3.0 + 2.0 * e_sw)) / pi_sw
            + c_rel * (1.0 + 3.0 * u) / (1.0 - u));
    Ok(GridPmf {
        offset: a_idx,
        p,
        trunc_upper,
        trunc_lower,
        roundoff: PmfRoundoff {
            d,
            r_up,
            x_low,
            r_sw,
            e_sw,
            pi_sw,
            sw_gap,
            c_rel,
            abs,
            tail_coef,
        },
    })
}

/// The grid-too-large error, with the tolerance that would fit: the points scale like `1/h`
/// and the excess like `h²`, so the tolerance must grow like the square of the overshoot.
fn grid_too_large(needed: f64, limit: usize, eps_error: f64) -> AccountantError {
    let ratio = needed / limit as f64;
    AccountantError::GridTooLarge {
        needed: needed.min(u64::MAX as f64) as u64,
        limit,
        eps_error,
        suggested_eps_error: eps_error * ratio * ratio * 1.2,
    }
}

// ---------------------------------------------------------------------------------------------
// Chernoff window.

/// A grid pmf prepared for exact log-MGF evaluation: (ln p_k, absolute index k) for p_k > 0.
struct LogPmf {
    lnp: Vec<f64>,
    idx: Vec<f64>,
    mean: f64,
    var: f64,
}

fn log_pmf(p: &GridPmf) -> LogPmf {
    let mut out = LogPmf {
        lnp: Vec::new(),
        idx: Vec::new(),
        mean: 0.0,
        var: 0.0,
    };
    let (mut s1, mut s2, mut s0) = (0.0, 0.0, 0.0);
    for (k, &v) in p.p.iter().enumerate() {
        if v > 0.0 {
            let i = (p.offset + k as i64) as f64;
            out.lnp.push(v.ln());
            out.idx.push(i);
            s0 += v;
            s1 += v * i;
        }
    }
    let mean = s1 / s0;
    for (k, &v) in p.p.iter().enumerate() {
        let d = (p.offset + k as i64) as f64 - mean;
        s2 += v * d * d;
    }
    out.mean = mean;
    out.var = s2 / s0;
    out
}

/// ln E[e^{λK}] (K in index units) of the grid pmf, exactly (up to round-off), with its first
/// two derivatives in λ (the tilted mean and variance of K).
fn log_mgf(c: &LogPmf, lambda: f64) -> (f64, f64, f64) {
    let mut mx = f64::NEG_INFINITY;
    for (&l, &k) in c.lnp.iter().zip(&c.idx) {
        mx = mx.max(l + lambda * k);
    }
    // Moments about the untilted mean keep the variance free of cancellation.
    let (mut s0, mut s1, mut s2) = (0.0, 0.0, 0.0);
    for (&l, &k) in c.lnp.iter().zip(&c.idx) {
        let e = (l + lambda * k - mx).exp();
        let d = k - c.mean;
        s0 += e;
        s1 += e * d;
        s2 += e * d * d;
    }
    let m1 = s1 / s0;
    (mx + s0.ln(), c.mean + m1, (s2 / s0 - m1 * m1).max(0.0))
}

/// The smallest index s with (a Chernoff bound on) P(S ≥ s) ≤ tau (upper = true), or the
/// largest index s with P(S ≤ s) ≤ tau (upper = false): s = ±(K(±λ) + ln(1/τ))/λ for the
/// cumulant K of the composed index sum. Any λ > 0 gives a valid bound; λ is the root of
/// ψ(λ) = λK'(λ) − K(λ) − ln(1/τ) (increasing, ψ' = λK''), found by safeguarded Newton steps
/// from the Gaussian optimum (or from `start`, the optimum of a coarser grid of the same
/// composition, evaluated there only), and the best bound seen is returned with its λ.
fn chernoff_point(
    parts: &[(LogPmf, f64)],
    tau: f64,
    upper: bool,
    start: Option<f64>,
) -> (f64, f64) {
    chernoff_point_tilted(parts, 0.0, (1.0 / tau).ln(), upper, start)
}

/// [`chernoff_point`] for the sum tilted by `e^{base·k}` (cumulant `K(base + μ) − K(base)`),
/// with the tail target given as `ln_inv_tau = ln(1/τ) > 0`.
fn chernoff_point_tilted(
    parts: &[(LogPmf, f64)],
    base: f64,
    ln_inv_tau: f64,
    upper: bool,
    start: Option<f64>,
) -> (f64, f64) {
    let sign = if upper { 1.0 } else { -1.0 };
    let mut k_base = 0.0;
    let mut var = 0.0;
    for (c, t) in parts {
        let (a, _, v) = log_mgf(c, base);
        k_base += t * a;
        var += t * v;
    }
    let var = var.max(1e-300);
    // (bound, ψ, ψ') at λ, in the tilted direction `sign`.
    let eval = |lambda: f64| {
        let (mut k, mut k1, mut k2) = (-k_base, 0.0, 0.0);
        for (c, t) in parts {
            let (a, b, v) = log_mgf(c, base + sign * lambda);
            k += t * a;
            k1 += t * sign * b;
            k2 += t * v;
        }
        let bound = (k + ln_inv_tau) / lambda;
        let psi = lambda * k1 - k - ln_inv_tau;
        let bound = if bound.is_nan() { f64::INFINITY } else { bound };
        (bound, psi, lambda * k2)
    };
    let (mut lambda, iters) = match start {
        Some(l) if l.is_finite() && l > 0.0 => (l, 1),
        // (Up to 40 steps: from the Gaussian optimum, heavy per-step tails can need many
        // bisections down before Newton steps take over.)
        _ => ((2.0 * ln_inv_tau / var).sqrt(), 40),
    };
    let (mut lo, mut hi) = (0.0_f64, f64::INFINITY);
    let (mut best, mut best_lambda) = (f64::INFINITY, lambda);
    for _ in 0..iters {
        let (bound, psi, dpsi) = eval(lambda);
        if bound < best {
            best = bound;
            best_lambda = lambda;
        }
        if !psi.is_finite() || psi > 0.0 {
            hi = lambda;
        } else {
            lo = lambda;
        }
        let newton = lambda - psi / dpsi;
        let next = if psi.is_finite() && dpsi > 0.0 && newton > lo && newton < hi {
            newton
        } else if hi.is_finite() {
            0.5 * (lo + hi)
        } else {
            2.0 * lambda
        };
        if (next - lambda).abs() <= 1e-6 * lambda {
            break;
        }
        lambda = next;
    }
    (sign * best, best_lambda)
}

/// The tilt λ ≥ 0 (index units) whose tilted mean `K'(λ)` of the composed index sum is
/// `target` (0 if the untilted mean is already at or above it): safeguarded Newton steps on the
/// increasing `K'`, from `start` if given. Only the tightness depends on it (any λ ≥ 0 gives a
/// valid bound).
fn saddle_tilt(parts: &[(LogPmf, f64)], target: f64, start: Option<f64>) -> f64 {
    let moments = |lambda: f64| {
        let (mut k1, mut k2) = (0.0, 0.0);
        for (c, t) in parts {
            let (_, b, v) = log_mgf(c, lambda);
            k1 += t * b;
            k2 += t * v;
        }
        (k1, k2)
    };
    let m0: f64 = parts.iter().map(|(c, t)| t * c.mean).sum();
    if target.is_nan() || target <= m0 || !target.is_finite() {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0_f64, f64::INFINITY);
    let mut lambda = match start {
        Some(l) if l.is_finite() && l > 0.0 => l,
        _ => {
            let v0: f64 = parts.iter().map(|(c, t)| t * c.var).sum();
            (target - m0) / v0.max(1e-300)
        }
    };
    for _ in 0..60 {
        let (k1, k2) = moments(lambda);
        if !k1.is_finite() || k1 > target {
            hi = lambda;
        } else {
            lo = lambda;
        }
        let newton = lambda - (k1 - target) / k2;
        let next = if k1.is_finite() && k2 > 0.0 && newton > lo && newton < hi {
            newton
        } else if hi.is_finite() {
            0.5 * (lo + hi)
        } else {
            2.0 * lambda
        };
        if (next - lambda).abs() <= 1e-5 * lambda {
            return next;
        }
        lambda = next;
    }
    if lambda.is_finite() { lambda } else { lo }
}

/// A saddle-point estimate (grid index) of where δ(ε) of the composed grid pmfs equals
/// `delta`: `δ(kh) ≈ e^{K(λ) − λk}/(max(1, λ_ε·sd_ε·√(2π))·(1 + λ_ε))` at the saddle λ of k
/// (`λ_ε = λ/h`, `sd_ε` the tilted standard deviation in ε units), solved by Newton steps in k
/// from the Chernoff point for `delta` (an upper bound on the answer). Used only to centre
/// the tilt.
fn saddle_index(parts: &[(LogPmf, f64)], delta: f64, h: f64) -> Option<f64> {
    let (s, l) = chernoff_point(parts, delta, true, None);
    if !(s.is_finite() && l.is_finite() && l > 0.0) {
        return None;
    }
    let m0: f64 = parts.iter().map(|(c, t)| t * c.mean).sum();
    let ln_d = delta.ln();
    let (mut k, mut lambda) = (s, l);
    for _ in 0..8 {
        lambda = saddle_tilt(parts, k, Some(lambda));
        if lambda.is_nan() || lambda <= 0.0 {
            return None;
        }
        let (mut kk, mut var) = (0.0, 0.0);
        for (c, t) in parts {
            let (a, _, v) = log_mgf(c, lambda);
            kk += t * a;
            var += t * v;
        }
        let le = lambda / h;
        let sd = var.max(0.0).sqrt() * h;
        let ln_est = kk
            - lambda * k
            - (le * sd * (2.0 * std::f64::consts::PI).sqrt())
                .max(1.0)
                .ln()
            - le.ln_1p();
        let step = (ln_est - ln_d) / lambda;
        let next = (k + step).clamp(0.5 * (k + m0), s);
        if !next.is_finite() {
            return None;
        }
        let done = (next - k).abs() < 1.0;
        k = next;
        if done {
            break;
        }
    }
    Some(k)
}

// ---------------------------------------------------------------------------------------------
// Composition.

/// Spacing of the stored (A, C, D) checkpoints of a composed direction.
const BLOCK: usize = 32;

#[cfg(test)]
thread_local! {
    /// Fallback bisections taken by [`ComposedDirection::eps_upper`] on this thread (tests).
    static EPS_UPPER_BISECTIONS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A composed PRV (one direction) on a window of the grid, ready for queries.
///
/// With `w_k` the composed grid pmf at grid index `k_lo + k`, the query tables are
/// `A_i = Σ_{k ≥ i} w_k`, `C_i = Σ_{k > i} w_k (1 − e^{−(k−i)h})` (δ_w at ε = (k_lo + i)h) and
/// `D_i = Σ_{k ≥ i} w_k e^{−(k−i)h}`, computed by the downward recurrence
/// `A_i = A_{i+1} + w_i`, `C_i = (1 − e^{−h}) A_{i+1} + e^{−h} C_{i+1}`,
/// `D_i = w_i + e^{−h} D_{i+1}`. Only every `BLOCK`-th triple is stored; any other one is
/// recomputed from the checkpoint above it with the same floating-point operations, so the
/// values are bit-identical to full tables (which would cost three fresh n-point arrays per
/// direction and call).
#[derive(Debug, Clone)]
struct ComposedDirection {
    h: f64,
    k_lo: i64,
    /// The composed grid pmf on the window.
    w: Vec<f64>,
    /// (A_i, C_i, D_i) at i = 0, BLOCK, 2·BLOCK, … (< n).
    ck: Vec<(f64, f64, f64)>,
    /// e^{−h}.
    eh: f64,
    /// 1 − e^{−h}.
    omeh: f64,
    /// Shift of the lower bound (Hoeffding term plus N·m*).
    shift_low: f64,
    /// Number of composed steps.
    n_steps: f64,
    /// Standard deviation of the composed grid distribution (ε units).
    sd: f64,
    /// The Chernoff tilts (upper, lower side) of the window, in units of 1/ε.
    tilts: (f64, f64),
    /// The composition's tilt and the tilted window's Chernoff parameter, in units of 1/ε
    /// (starting points for a finer grid).
    tilt_hint: (f64, f64),
    /// δ mass added to the upper bound at every ε (truncation, mass outside the window).
    extra_up: f64,
    /// δ mass subtracted from the lower bound at every ε.
    extra_low: f64,
    /// Round-off bounds that depend on ε (module docs, round-off): at the first grid index
    /// `k0 > ε/h`, the upper bound adds `3·b_up·e^{−λ(k0 − k_ref)}` and the lower bound
    /// subtracts `3·b_low·e^{−λ(k0 − k_ref)}` (λ = `lambda`, the composition's tilt).
    b_up: f64,
    b_low: f64,
    /// The grid pmfs' round-off charged relative to the tail (module docs, round-off, 5):
    /// `kappa·τ(ε − 3h)`, with τ from [`Self::tail_bound`].
    kappa: f64,
    /// ln of the Chernoff factor at `k_ref` of every composition of the steps' exact or
    /// computed pmfs (its MGF drift included): `P(S ≥ x) ≤ e^{ln_ch_ref − λ(⌈x/h⌉ − k_ref)}`.
    ln_ch_ref: f64,
    /// The step Δ of the δ-trick `P(S ≥ x) ≤ δ(x − Δ)/(1 − e^{−Δ})`.
    dpmf: f64,
    /// The exponential tilt λ of the FFT composition, per grid index (0: untilted).
    lambda: f64,
    /// Reference grid index of the bounds `b_up`, `b_low`.
    k_ref: f64,
    /// Relative round-off of δ_w as evaluated (tilting, untilting, tables), charged as a
    /// factor `1 + rel` on it.
    rel: f64,
    /// Below this ε the window holds no usable values (dropped where the tilt amplifies the
    /// FFT's error): the upper bound is 1 and the lower bound 0 there. −∞ if nothing was
    /// dropped.
    lowest: f64,
    /// 1, or the factor by which a coarser grid step would have let the window keep the full
    /// tilt within the grid limit (its tilt was halved for lack of points, at a cost in
    /// tightness).
    coarser: f64,
    /// Where the steps' heavy upper tails were split off (method 8): the tail terms added to
    /// the upper bound; the window then holds the composition of the clamped losses.
    split: Option<std::sync::Arc<split::SplitTail>>,
}

impl ComposedDirection {
    /// Composed pmf `w` (window starting at grid index `k_lo`) → direction with checkpoints.
    fn new(h: f64, k_lo: i64, w: Vec<f64>, shift_low: f64, extra_up: f64, extra_low: f64) -> Self {
        let mut out = Self {
            h,
            k_lo,
            ck: Vec::with_capacity(w.len().div_ceil(BLOCK)),
            w,
            eh: (-h).exp(),
            omeh: -(-h).exp_m1(),
            shift_low,
            n_steps: 0.0,
            sd: 0.0,
            tilts: (f64::NAN, f64::NAN),
            tilt_hint: (f64::NAN, f64::NAN),
            extra_up,
            extra_low,
            b_up: 0.0,
            b_low: 0.0,
            kappa: 0.0,
            ln_ch_ref: 0.0,
            dpmf: 1.0,
            lambda: 0.0,
            k_ref: 0.0,
            rel: 0.0,
            lowest: f64::NEG_INFINITY,
            coarser: 1.0,
            split: None,
        };
        let n = out.n();
        out.ck.resize(n.div_ceil(BLOCK), (0.0, 0.0, 0.0));
        let mut st = (0.0, 0.0, 0.0);
        for i in (0..n).rev() {
            st = out.step(i, st);
            if i % BLOCK == 0 {
                out.ck[i / BLOCK] = st;
            }
        }
        out
    }

    fn n(&self) -> usize {
        self.w.len()
    }

    /// (A_k, C_k, D_k) from (A_{k+1}, C_{k+1}, D_{k+1}) (zeros above the window).
    #[inline]
    fn step(&self, k: usize, (a1, c1, d1): (f64, f64, f64)) -> (f64, f64, f64) {
        let c = if k + 1 < self.n() {
            self.omeh * a1 + self.eh * c1
        } else {
            0.0
        };
        (a1 + self.w[k], c, self.w[k] + self.eh * d1)
    }

    /// (A_i, C_i, D_i), recomputed from the checkpoint at or above i.
    fn state(&self, i: usize) -> (f64, f64, f64) {
        let m = i.div_ceil(BLOCK) * BLOCK;
        let (mut st, top) = if m < self.n() {
            (self.ck[m / BLOCK], m)
        } else {
            ((0.0, 0.0, 0.0), self.n())
        };
        for k in (i..top).rev() {
            st = self.step(k, st);
        }
        st
    }

    /// δ_w(ε) of the windowed grid distribution.
    fn delta_w(&self, eps: f64) -> f64 {
        let n = self.n();
        let j = (eps / self.h).floor() as i64 + 1;
        let i = j - self.k_lo;
        if i >= n as i64 {
            return 0.0;
        }
        let (i, u) = if i < 0 {
            (0usize, self.k_lo as f64 * self.h - eps)
        } else {
            (i as usize, j as f64 * self.h - eps)
        };
        let e = (-u).exp();
        let (a, c, _) = self.state(i);
        (a * (1.0 - e) + e * c).max(0.0)
    }

    /// The first i with C_i ≤ target (C is non-increasing and C_{n−1} = 0 ≤ target), with
    /// (A_i, C_i, D_i): binary search over the checkpoints, then a scan down the block.
    fn first_below(&self, target: f64) -> (usize, (f64, f64, f64)) {
        let n = self.n();
        let Some(&c0) = self.ck.first() else {
            // An empty window (every value dropped below `lowest`) holds no mass.
            return (0, (0.0, 0.0, 0.0));
        };
        if c0.1 <= target {
            return (0, c0);
        }
        // First checkpoint j ≥ 1 with C ≤ target (ck.len() if none): ck[lo].C > target.
        let (mut lo, mut hi) = (0usize, self.ck.len());
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.ck[mid].1 <= target {
                hi = mid
            } else {
                lo = mid
            }
        }
        let mut i = (hi * BLOCK).min(n - 1);
        let mut st = self.state(i);
        while i > lo * BLOCK + 1 {
            let next = self.step(i - 1, st);
            if next.1 > target {
                break;
            }
            i -= 1;
            st = next;
        }
        (i, st)
    }

    /// Smallest ε with δ_w(ε) ≤ target (−∞ if every ε qualifies).
    fn eps_w(&self, target: f64) -> f64 {
        let (i, (a, _, d)) = self.first_below(target);
        let j = self.k_lo + i as i64;
        let num = a - target;
        if num <= 0.0 {
            return if i == 0 {
                f64::NEG_INFINITY
            } else {
                j as f64 * self.h - self.h
            };
        }
        let ratio = d / num;
        let mut u = ratio.ln().max(0.0);
        if i > 0 {
            u = u.min(self.h);
        }
        j as f64 * self.h - u
    }

    /// The ε-dependent round-off term `e^{−λ(k0 − k_ref)}` at ε (`k0` the first grid index
    /// above ε), as a factor of `b_up` / `b_low`.
    fn decay(&self, eps: f64) -> f64 {
        if self.lambda == 0.0 {
            return 1.0;
        }
        let k0 = (eps / self.h).floor() + 1.0;
        (-self.lambda * (k0 - self.k_ref)).exp()
    }

    /// The Chernoff bound `P(S ≥ x) ≤ e^{ln_ch_ref − λ(⌈x/h⌉ − k_ref)}` on the tail of every
    /// composition of the steps' exact or computed grid pmfs (module docs, round-off, 5).
    fn chernoff(&self, x: f64) -> f64 {
        let v = if self.lambda == 0.0 {
            self.ln_ch_ref
        } else {
            self.ln_ch_ref - self.lambda * ((x / self.h).ceil() - self.k_ref)
        };
        if v.is_nan() { f64::INFINITY } else { v.exp() }
    }

    /// τ(x): a bound on the tail `P(S ≥ x)` of every composition of the steps' exact or
    /// computed grid pmfs, the smaller of the Chernoff bound and the δ-trick
    /// `P(S ≥ x) ≤ δ(x − Δ)/(1 − e^{−Δ})` with δ(x − Δ) bounded by the computed composition
    /// (its FFT and point round-off, and the tail term at the Chernoff bound).
    fn tail_bound(&self, x: f64) -> f64 {
        let ch = self.chernoff(x);
        let y = x - self.dpmf;
        if y.is_nan() || y < self.lowest {
            return ch;
        }
        let b =
            (1.0 + self.rel) * (self.delta_w(y) + 3.0 * self.b_up * self.decay(y)) + self.extra_up;
        let inner = (b + self.kappa * self.chernoff(y - 3.0 * self.h)) / -(-self.dpmf).exp_m1();
        if inner.is_nan() { ch } else { ch.min(inner) }
    }

    /// The grid pmfs' round-off charged relative to the tail at ε: `kappa·τ(ε − 3h)`. It is
    /// non-increasing in the sense that its value at ε bounds the charge at every ε' ≥ ε (τ
    /// bounds a tail probability at ε − 3h, which bounds those further out).
    fn pmf_tail(&self, eps: f64) -> f64 {
        if self.kappa == 0.0 {
            return 0.0;
        }
        let v = self.kappa * self.tail_bound(eps - 3.0 * self.h);
        if v.is_nan() { f64::INFINITY } else { v }
    }

    /// The round-off charged at ε (FFT and pmf points through the decay, the pmf's tail term).
    fn charge(&self, eps: f64) -> f64 {
        3.0 * self.b_up * self.decay(eps) + self.pmf_tail(eps)
    }

    /// The certified upper bound on δ(ε) of this direction alone: [`Self::body_upper`], plus
    /// the tail terms where the heavy tails were split off (method 8), capped at 1.
    fn delta_upper(&self, eps: f64) -> f64 {
        match &self.split {
            None => self.body_upper(eps),
            Some(sp) => {
                let v = self.body_min(eps) + sp.term(eps, |part, x| self.less_one(part, x));
                if v.is_nan() { 1.0 } else { v.min(1.0) }
            }
        }
    }

    /// The smaller of the two certified bounds on the body's δ(ε) of a split direction (the
    /// window's and the one composed centred lower), [`Self::body_upper`] otherwise.
    fn body_min(&self, eps: f64) -> f64 {
        let a = self.body_upper(eps);
        match &self.split {
            Some(sp) if !sp.low_less_one => match &sp.low {
                Some(low) => a.min(low.body_upper(eps)),
                None => a,
            },
            _ => a,
        }
    }

    /// A split direction's certified bound on `D_i(x)`, the body's δ at x less one step of the
    /// tail's part (split module: `U(x − s)/(1 − π)`, or the composition with one step fewer).
    fn less_one(&self, part: &split::TailPart, x: f64) -> f64 {
        match &self.split {
            Some(sp) if sp.low_less_one => match &sp.low {
                Some(low) => low.body_upper(x),
                None => self.body_min(x - part.s) * part.inv_m,
            },
            _ => self.body_min(x - part.s) * part.inv_m,
        }
    }

    /// The certified upper bound on δ(ε) of the composition in the window:
    /// `(1 + rel)·(δ_w(ε) + charge(ε)) + extra_up`, capped at 1 (1 below `lowest`).
    fn body_upper(&self, eps: f64) -> f64 {
        if eps < self.lowest {
            return 1.0;
        }
        let v = (1.0 + self.rel) * (self.delta_w(eps) + self.charge(eps)) + self.extra_up;
        if v.is_nan() { 1.0 } else { v.min(1.0) }
    }

    /// The certified lower bound on δ(ε) of this direction alone (Hoeffding shift, module
    /// docs): `(δ_w(ε + shift) − 3·b_low·decay − pmf_tail)/(1 + rel) − extra_low`, at least 0.
    fn delta_lower(&self, eps: f64) -> f64 {
        let x = eps + self.shift_low;
        if x < self.lowest {
            return 0.0;
        }
        let v = (self.delta_w(x) - 3.0 * self.b_low * self.decay(x) - self.pmf_tail(x))
            / (1.0 + self.rel)
            - self.extra_low;
        if v.is_nan() { 0.0 } else { v.max(0.0) }
    }

    /// The certified upper bound on ε(δ) of this direction alone (the query of
    /// [`ComposedPrv::epsilon`]): an ε at which [`Self::delta_upper`] is at most δ, so that
    /// the true δ(ε) ≤ δ there, hence ε(δ) ≤ ε (δ(·) is non-increasing). The ε-dependent
    /// round-off term is evaluated at a point `e0` below the answer (it decreases in ε); the
    /// answer is checked, and searched by bisection if the check fails.
    fn eps_upper(&self, delta: f64) -> Result<f64> {
        if self.split.is_some() {
            return self.eps_upper_split(delta);
        }
        let room = (delta - self.extra_up) / (1.0 + self.rel);
        let below = |extra: f64| AccountantError::DeltaBelowAccuracy {
            delta,
            delta_error: extra,
        };
        if room <= 0.0 {
            return Err(below(self.extra_up));
        }
        let e0 = self.eps_w(room).max(self.lowest).max(0.0);
        let var0 = self.charge(e0);
        let target = room - var0;
        let mut up = if target > 0.0 {
            self.eps_w(target).max(e0).max(0.0)
        } else {
            e0
        };
        if !up.is_finite() {
            return Err(AccountantError::NumericalFailure("epsilon query"));
        }
        if self.delta_upper(up) > delta {
            #[cfg(test)]
            EPS_UPPER_BISECTIONS.with(|c| c.set(c.get() + 1));
            // The decaying round-off term at e0 exceeded the room, or the tables' inversion
            // disagreed with the direct evaluation (round-off): bisect between `up` and the top
            // of the window for an ε whose bound holds.
            let mut hi = (self.k_lo + self.n() as i64) as f64 * self.h;
            if self.delta_upper(hi) > delta {
                return Err(below(self.delta_upper(hi)));
            }
            let mut lo = up;
            for _ in 0..64 {
                let mid = 0.5 * (lo + hi);
                if self.delta_upper(mid) <= delta {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            up = hi;
        }
        Ok(up)
    }

    /// [`Self::eps_upper`] with the tail terms of a split (method 8): they are non-negative, so
    /// the answer lies at or above the window's own answer; from there the bound is stepped up
    /// until it holds, then bisected. The point returned is one where [`Self::delta_upper`]
    /// was evaluated and found at most δ.
    fn eps_upper_split(&self, delta: f64) -> Result<f64> {
        let below = |extra: f64| AccountantError::DeltaBelowAccuracy {
            delta,
            delta_error: extra,
        };
        let rho2 = self.split.as_ref().map_or(0.0, |s| s.rho2);
        if self.extra_up + rho2 >= delta {
            return Err(below(self.extra_up + rho2));
        }
        let mut lo = self.eps_w((delta - self.extra_up) / (1.0 + self.rel)) - 2.0 * self.h;
        if !lo.is_finite() || lo < self.lowest {
            lo = self.lowest.max(0.0);
        }
        let mut lo = lo.max(0.0);
        if self.delta_upper(lo) <= delta {
            return Ok(lo);
        }
        let top = (self.k_lo + self.n() as i64) as f64 * self.h;
        let mut step = self.h.max(1e-4 * lo);
        let mut hi = lo + step;
        let mut found = false;
        for _ in 0..80 {
            if self.delta_upper(hi) <= delta {
                found = true;
                break;
            }
            lo = hi;
            step *= 2.0;
            hi = lo + step;
            if lo > top + 64.0 {
                break;
            }
        }
        if !found {
            return Err(below(self.delta_upper(hi)));
        }
        // False position on ln δ (Illinois), keeping the bracket: δ(lo) > δ ≥ δ(hi).
        let ld = delta.ln();
        let (mut flo, mut fhi) = (
            self.delta_upper(lo).ln() - ld,
            self.delta_upper(hi).ln() - ld,
        );
        let mut side = 0i32;
        for _ in 0..60 {
            if hi - lo <= 1e-10 * hi.abs() {
                break;
            }
            let mut mid = if flo.is_finite() && fhi.is_finite() && flo > fhi {
                hi - fhi * (hi - lo) / (fhi - flo)
            } else {
                0.5 * (lo + hi)
            };
            if !(mid > lo && mid < hi) {
                mid = 0.5 * (lo + hi);
            }
            let fm = self.delta_upper(mid).ln() - ld;
            if fm <= 0.0 {
                hi = mid;
                fhi = fm;
                if side == 1 {
                    flo *= 0.5;
                }
                side = 1;
            } else {
                lo = mid;
                flo = fm;
                if side == -1 {
                    fhi *= 0.5;
                }
                side = -1;
            }
        }
        if !hi.is_finite() {
            return Err(AccountantError::NumericalFailure("epsilon query"));
        }
        Ok(hi)
    }

    /// The certified lower bound on ε(δ) of this direction alone (0 where `x*` is not above
    /// `lowest`): with `x*` the smallest ε at
    /// which `δ_w ≤ (δ + extra_low)(1 + rel) + 3·b_low·decay(x_g) + pmf_tail(x_g)` (`x_g` ≤ `x*`
    /// a point where the decaying terms are evaluated; they bound the terms at every x ≥ x_g), every ε' < x* − shift has δ(ε') > δ (at `ε' + shift ≥ x_g` by
    /// [`Self::delta_lower`], below by monotonicity), so ε(δ) ≥ x* − shift.
    fn eps_lower(&self, delta: f64) -> f64 {
        let base = ((delta + self.extra_low) * (1.0 + self.rel)).min(1.0);
        let x_g = self.eps_w((2.0 * base).min(1.0)).max(self.lowest);
        let var = 3.0 * self.b_low * self.decay(x_g) + self.pmf_tail(x_g);
        if var.is_nan() || var > base || !x_g.is_finite() {
            return 0.0;
        }
        let x = self.eps_w((base + var).min(1.0)).max(x_g);
        // Where the window's values below `lowest` were dropped, the crossing must lie above
        // it: at `lowest` itself δ_w is already small enough, and below it nothing is known.
        if x <= self.lowest || x.is_nan() {
            return 0.0;
        }
        let v = x - self.shift_low;
        if v.is_finite() { v.max(0.0) } else { 0.0 }
    }

    /// R = δ''(ε)/(−δ'(ε)) of the composed grid distribution, by central differences over a
    /// few grid steps (0 where δ is flat). Used only for the estimate and the choice of `h`.
    fn curvature(&self, eps: f64) -> f64 {
        let d = (32.0 * self.h).min(0.05 * self.sd).max(4.0 * self.h);
        let (a, b, c) = (
            self.delta_w(eps - d),
            self.delta_w(eps),
            self.delta_w(eps + d),
        );
        let slope = (a - c) / (2.0 * d);
        let second = (a - 2.0 * b + c) / (d * d);
        if slope > 0.0 && second.is_finite() {
            (second / slope).max(0.0)
        } else {
            0.0
        }
    }

    /// Estimated excess of the pessimistic discretization at ε (module docs): the mean shift
    /// `N·s(h)` plus the added variance's effect `N (h²/12) R`.
    fn excess(&self, eps: f64) -> f64 {
        self.n_steps * (mean_shift(self.h) + self.h * self.h / 12.0 * self.curvature(eps))
    }
}

/// `s(h) = h/(1 − e^{−h}) − 1 − h/2`, the mean shift of one pessimistic rounding of a value
/// uniform in its bin (≈ h²/12; series below 0.01 to avoid cancellation).
fn mean_shift(h: f64) -> f64 {
    if h < 1e-2 {
        h * h / 12.0 * (1.0 - h * h / 60.0)
    } else {
        h / (-(-h).exp_m1()) - 1.0 - 0.5 * h
    }
}

/// An upper bound on `m* = max_u (h·π(u) − u)`, the largest conditional mean of one
/// pessimistic rounding: with `r = h/(1 − e^{−h})`, `m* = (r − 1) − ln r ≤ (r − 1)²/2` and
/// `r − 1 ≤ h/2 + h²/12`.
fn max_round_up(h: f64) -> f64 {
    let x = 0.5 * h + h * h / 12.0;
    0.5 * x * x
}

/// Fraction of the ε tolerance the grid step aims at (the excess model is an estimate).
const TOL_AIM: f64 = 0.8;

/// Grid step for an excess target `tol` over `n_steps` steps at curvature `r` (module docs):
/// `E(h) = (N + 1) h² (1 + R)/12` set to `TOL_AIM·tol`. The `N + 1` (rather than `N`) covers
/// few-step compositions, where the chord error of the single-step interpolation (up to
/// `h² R/8` between grid points) is not yet averaged out.
fn grid_step(tol: f64, n_steps: f64, r: f64) -> f64 {
    (12.0 * TOL_AIM * tol / ((n_steps + 1.0) * (1.0 + r))).sqrt()
}

/// Where the FFT composition's exponential tilt is centred (module docs, round-off): only the
/// tightness of the bounds depends on it.
#[derive(Debug, Clone, Copy)]
enum Tilt {
    /// At the Chernoff point of the composed loss for tail mass δ (ε(δ) queries at this δ).
    Delta(f64),
    /// At ε (δ(ε) queries at this ε, fine passes at their coarse pass's ε).
    Eps(f64),
}

struct Plan {
    h: f64,
    /// Centre of the tilt.
    tilt: Tilt,
    /// Target excess (for error messages).
    eps_error: f64,
    /// About the δ the queries are expected at (NaN if unknown): how much round-off the
    /// tilt's choice may leave (see [`TILT_ROUNDOFF_SHARE`]).
    delta_hint: f64,
    /// Rounding tail of the lower bound.
    eta: f64,
    tail_mass: f64,
    tau: f64,
}

/// Assumed normwise accuracy of the FFTs per level (module docs, round-off):
/// `‖fl(FFT x) − FFT x‖₂ ≤ FFT_LEVEL_C·log2(n)·u·‖FFT x‖₂`.
const FFT_LEVEL_C: f64 = 32.0;

/// How far the window may grow (a multiple of the untilted window) to keep the composition's
/// tilt where halving it would cost tightness (heavy per-step tails; module docs, round-off, 2).
const TILT_GROWTH_MAX: f64 = 64.0;

/// The share of the ε tolerance that the FFT's round-off may take before the window grows to
/// keep the tilt (see [`TILT_GROWTH_MAX`]).
const TILT_ROUNDOFF_SHARE: f64 = 1e-3;

/// Below the reference point, the window keeps the grid values whose ε-dependent round-off
/// bound is at most this fraction of the mass above them (module docs, round-off).
const USABLE_FRACTION: f64 = 1e-3;

/// One direction of a flat composition: the grid pmf of each step's loss on `plan.h`, then
/// their composition ([`compose_pmfs`]). `hint` carries a coarser pass's tilts.
fn compose_direction(
    parts: &[(SubsampledGaussian, u64)],
    dir: Direction,
    plan: &Plan,
    acc: &Accuracy,
    hint: Option<((f64, f64), (f64, f64))>,
) -> Result<ComposedDirection> {
    let t0 = std::time::Instant::now();
    let mut pmfs = Vec::with_capacity(parts.len());
    for (m, t) in parts {
        let loss = Loss {
            q: m.q(),
            sigma: m.sigma(),
            dir,
        };
        pmfs.push((
            build_pmf(loss, plan.h, plan.tail_mass, acc.max_points, plan.eps_error)?,
            *t as f64,
        ));
    }
    // Heavy upper tails (method 8): the remove direction's loss has a rare, heavy upper tail
    // at small q; where it carries the saddle tilt, the body is composed alone and the tail
    // steps are counted. Both compositions certify this direction: the tighter at the
    // expected query point is kept. The split is tried only where the unsplit composition
    // does not fit or its round-off charge there is at least `SPLIT_CHARGE` of δ (elsewhere it
    // cannot gain much, and it costs two more compositions).
    if dir != Direction::Remove {
        return compose_pmfs(&pmfs, dir, plan, acc.max_points, hint, t0);
    }
    let full = compose_pmfs(&pmfs, dir, plan, acc.max_points, hint, t0);
    if let Ok(f) = &full {
        let d = if plan.delta_hint.is_finite() && plan.delta_hint > 0.0 {
            plan.delta_hint
        } else {
            match plan.tilt {
                Tilt::Delta(d) => d,
                Tilt::Eps(e) => f.delta_w(e),
            }
        };
        let at = match plan.tilt {
            Tilt::Eps(e) => e,
            Tilt::Delta(_) => f.eps_upper(d).unwrap_or(f64::NAN),
        };
        let charge = (1.0 + f.rel) * f.charge(at);
        if at.is_finite() && d > 0.0 && charge < SPLIT_CHARGE * d {
            return full;
        }
    }
    let split = split_direction(parts, &pmfs, dir, plan, acc, hint, t0);
    // (Where the unsplit window does not fit, the split one may.)
    let body = match split {
        Ok(Some((b, _))) => b,
        Ok(None) => return full,
        Err(e) => return full.and(Err(e)),
    };
    let score = |d: &ComposedDirection| -> f64 {
        if plan.delta_hint.is_finite() && plan.delta_hint > 0.0 {
            d.eps_upper(plan.delta_hint).unwrap_or(f64::INFINITY)
        } else {
            match plan.tilt {
                Tilt::Eps(e) => d.delta_upper(e),
                Tilt::Delta(dd) => d.eps_upper(dd).unwrap_or(f64::INFINITY),
            }
        }
    };
    let full = match full {
        Ok(f) => f,
        Err(e) => {
            if std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some() {
                eprintln!(
                    "{dir:?}: split at the centre {:.9e}; unsplit: {e}",
                    score(&body)
                );
            }
            return Ok(body);
        }
    };
    let (a, b) = (score(&full), score(&body));
    if std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some() {
        eprintln!("{dir:?}: split at the centre {b:.9e} against unsplit {a:.9e}");
    }
    Ok(if b < a { body } else { full })
}

/// The unsplit composition's round-off charge at the expected query point, relative to δ, from
/// which a split is tried (method 8).
const SPLIT_CHARGE: f64 = 1e-5;

/// The share of the grid's ε tolerance that the round-off charge at a split direction's answer
/// may move ε before the fine pass composes that direction again centred lower (see
/// `PrvAccountant::recentre_split`).
const RECENTRE_SHARE: f64 = 0.1;

/// The share of the saddle-tilted sum carried by the steps' tails above the cuts from which a
/// split is tried (method 8).
const SPLIT_TRIGGER: f64 = 1e-2;

/// The body of a split composition (method 8) with the tail's share of the tilted sum, or
/// `None` where the steps' upper tails do not
/// carry the saddle tilt (their tilted mass above the cut is below 1 %) or no cut applies.
/// The cut of each part is the grid value where `Σ T_i·P(Y_i > c_i)` is at most `√τ`.
#[allow(clippy::too_many_arguments)]
fn split_direction(
    parts: &[(SubsampledGaussian, u64)],
    pmfs: &[(GridPmf, f64)],
    dir: Direction,
    plan: &Plan,
    acc: &Accuracy,
    hint: Option<((f64, f64), (f64, f64))>,
    t0: std::time::Instant,
) -> Result<Option<(ComposedDirection, f64)>> {
    let h = plan.h;
    let n_all: f64 = parts.iter().map(|(_, t)| *t as f64).sum();
    // The cut's Σ T_i π_i: √τ where k ≥ 2 is bounded as a whole; with the k = 2 term counted
    // (one part with a tail, T ≥ 2; split module docs) the smaller of (3τ)^{1/3} and
    // τ/(3T·η) (η of a window of about 2^20 points: only the tightness depends on it), not
    // below √τ.
    let eta_est = FFT_LEVEL_C * 20.0 * UNIT_ROUNDOFF;
    let target_pair = (3.0 * plan.tau)
        .cbrt()
        .min(plan.tau / (3.0 * n_all * eta_est))
        .max(plan.tau.sqrt())
        / n_all;
    let target_single = plan.tau.sqrt() / n_all;
    if !(target_single > 0.0 && target_single < 1e-3) {
        return Ok(None);
    }
    let logp: Vec<(LogPmf, f64)> = pmfs.iter().map(|(p, t)| (log_pmf(p), *t)).collect();
    // (The saddle tilt needs only the sum's mean and support from the window's stage.)
    let base = compose::UntiltedWindow {
        k_hi: f64::NAN,
        k_lo: f64::NAN,
        lambda_hi: f64::NAN,
        lambda_lo: f64::NAN,
        full_lo: pmfs.iter().map(|(p, t)| t * p.offset as f64).sum(),
        full_hi: pmfs
            .iter()
            .map(|(p, t)| t * (p.offset + p.p.len() as i64 - 1) as f64)
            .sum(),
        mean_idx: logp.iter().map(|(c, t)| t * c.mean).sum(),
    };
    let (lambda0, _, _) = compose::centre_tilt(&logp, plan.tilt, h, &base, None);
    if !(lambda0 > 0.0 && lambda0.is_finite()) {
        return Ok(None);
    }
    let find_cuts = |target: f64| -> (Vec<Option<i64>>, f64) {
        let mut cuts: Vec<Option<i64>> = Vec::with_capacity(parts.len());
        let mut tilted_tail = 0.0_f64;
        for ((m, _), ((p, t), (lp, _))) in parts.iter().zip(pmfs.iter().zip(&logp)) {
            let loss = Loss {
                q: m.q(),
                sigma: m.sigma(),
                dir,
            };
            let len = p.p.len();
            if m.q() >= 1.0 || len < 8 {
                cuts.push(None);
                continue;
            }
            // The smallest k with Σ_{j > k} p_j ≤ target/2, then up until the exact tail holds.
            let mut mass = 0.0_f64;
            let mut k = p.offset + len as i64 - 1;
            for idx in (0..len).rev() {
                if mass + p.p[idx] > 0.5 * target {
                    break;
                }
                mass += p.p[idx];
                k = p.offset + idx as i64 - 1;
            }
            let top = p.offset + len as i64 - 1;
            let mut ok = false;
            for _ in 0..64 {
                if k >= top - 2 {
                    break;
                }
                match split::tail_above(&loss, k as f64 * h, h) {
                    Some(v) if v <= target => {
                        ok = true;
                        break;
                    }
                    Some(_) => k += 1 + (k - p.offset).max(0) / 64,
                    None => break,
                }
            }
            if !ok || k < p.offset + 3 {
                cuts.push(None);
                continue;
            }
            let ln_m = log_mgf(lp, lambda0).0;
            let first = (k + 1 - p.offset) as usize;
            let tt: f64 = p.p[first..]
                .iter()
                .enumerate()
                .filter(|(_, v)| **v > 0.0)
                .map(|(i, v)| (v.ln() + lambda0 * (k + 1 + i as i64) as f64 - ln_m).exp())
                .sum();
            tilted_tail += t * tt;
            cuts.push(Some(k));
        }
        (cuts, tilted_tail)
    };
    // The k = 2 term is counted where exactly one part has a cut and T ≥ 2 steps of it.
    let pair_ok = |cuts: &[Option<i64>]| {
        cuts.iter().filter(|c| c.is_some()).count() == 1
            && cuts
                .iter()
                .zip(parts)
                .any(|(c, (_, t))| c.is_some() && *t >= 2)
    };
    let (mut cuts, mut tilted_tail) = (Vec::new(), 0.0_f64);
    let mut pair = false;
    if target_pair > target_single && target_pair < 1e-3 {
        (cuts, tilted_tail) = find_cuts(target_pair);
        pair = pair_ok(&cuts);
    }
    if !pair {
        (cuts, tilted_tail) = find_cuts(target_single);
        pair = target_pair <= target_single && pair_ok(&cuts);
    }
    let trace = std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some();
    if trace {
        eprintln!(
            "{dir:?}: split cuts {cuts:?} (k = 2 counted: {pair}), tilted mass above them {tilted_tail:.3e}"
        );
    }
    // (Several parts with tails would need the shifted bound of the k = 1 term, which costs
    // about q in ε: not tried.)
    if tilted_tail.is_nan()
        || tilted_tail < SPLIT_TRIGGER
        || cuts.iter().filter(|c| c.is_some()).count() != 1
    {
        return Ok(None);
    }
    // The clamped pmfs (no truncation charge at the top: the tail terms cover Y > c) and the
    // tails above the cuts.
    let mut capped = Vec::with_capacity(parts.len());
    let mut tails = Vec::new();
    let mut mass = 0.0_f64;
    let mut atom_err = 0.0_f64;
    for (((m, t), (p, _)), cut) in parts.iter().zip(pmfs).zip(&cuts) {
        let Some(k) = *cut else {
            capped.push((p.clone(), *t as f64));
            continue;
        };
        let loss = Loss {
            q: m.q(),
            sigma: m.sigma(),
            dir,
        };
        let mut b = build_pmf_capped(
            loss,
            h,
            plan.tail_mass,
            acc.max_points,
            plan.eps_error,
            Some(k),
        )?;
        if b.offset + b.p.len() as i64 - 1 != k {
            return Ok(None);
        }
        b.trunc_upper = 0.0;
        capped.push((b, *t as f64));
        // The dropped top mass as computed against the exact P(Y > c).
        let c = k as f64 * h;
        let computed = loss.edge_tails(c, true).p;
        let (Some(hi), Some(lo)) = (
            split::tail_above(&loss, c, h),
            split::tail_at_least(&loss, c, h),
        ) else {
            return Ok(None);
        };
        // (Plus the rounding of the top entry, summed without the mass.)
        let top_entry = capped
            .last()
            .map_or(0.0, |(b, _)| b.p.last().copied().unwrap_or(0.0));
        atom_err += *t as f64
            * ((hi - computed).max(computed - lo).max(0.0)
                + 2.0 * UNIT_ROUNDOFF * (computed + top_entry));
        // The table ends where n·P(Y > y) ≤ 1e-3·τ (the rest is charged as mass beyond it):
        // its end by doubling, then the brackets in parallel.
        let small = |j: i64| {
            split::tail_above(&loss, j as f64 * h, h).is_none_or(|v| v * n_all <= 1e-3 * plan.tau)
        };
        let mut len: i64 = 64;
        while !small(k + len) && len < 1 << 22 {
            len *= 2;
        }
        let brackets: Option<Vec<_>> = (0..=len)
            .into_par_iter()
            .map(|e| split::tails_bracket(&loss, (k + e) as f64 * h, h))
            .collect();
        let Some(brackets) = brackets else {
            return Ok(None);
        };
        let (vals, masses) = split::tail_suffix(&brackets, k, h);
        let pair_tails = if pair {
            split::pair_suffix(&masses, vals.last().copied().unwrap_or(1.0), hi)?
        } else {
            Vec::new()
        };
        mass += *t as f64 * hi;
        // The loss is above ln(1 − q): any s ≥ −ln(1 − q) will do.
        let s = -(-m.q()).ln_1p() * (1.0 + 1e-9) + 1e-300;
        let inv_m = (1.0 + 4.0 * UNIT_ROUNDOFF) / (1.0 - hi);
        tails.push(split::TailPart {
            t: *t as f64,
            k_cut: k,
            s,
            inv_m,
            tails: vals,
            pair: pair_tails,
        });
    }
    // P(N ≥ 2) ≤ (Σ T_i π_i)²/2, or P(N ≥ 3) ≤ (Σ T_i π_i)³/6 with the k = 2 term counted.
    let rho2 = if pair {
        (mass * mass * mass / 6.0 + atom_err) * (1.0 + 1e-12)
    } else {
        (0.5 * mass * mass + atom_err) * (1.0 + 1e-12)
    };
    let less_one = cuts.iter().filter(|c| c.is_some()).count() == 1;
    let mut body = compose_pmfs(&capped, dir, plan, acc.max_points, hint, t0)?;
    // The k = 1 term reads the body at ε less a tail step's loss, far below the window's
    // tilt (whose values there may have been dropped): the body again, untilted. Its absolute
    // round-off (about 1e-9) is multiplied by Σ T_i π_i ≤ √τ in the k = 1 term, small
    // against δ for δ down to about 1e-13 (below, the bound stays certified but loosens).
    let low = {
        let low_plan = Plan {
            h,
            tilt: Tilt::Eps(0.0),
            eps_error: plan.eps_error,
            delta_hint: f64::NAN,
            eta: plan.eta,
            tail_mass: plan.tail_mass,
            tau: plan.tau,
        };
        // With one tail part, one step fewer of it: the k = 1 term's own composition.
        let mut low_pmfs = capped.clone();
        if less_one {
            for ((_, t), cut) in low_pmfs.iter_mut().zip(&cuts) {
                if cut.is_some() {
                    *t -= 1.0;
                    if *t < 1.0 {
                        return Ok(None);
                    }
                }
            }
        }
        Some(compose_pmfs(
            &low_pmfs,
            dir,
            &low_plan,
            acc.max_points,
            None,
            t0,
        )?)
    };
    body.split = Some(std::sync::Arc::new(split::SplitTail {
        h,
        parts: tails,
        rho2,
        low,
        low_less_one: less_one,
    }));
    Ok(Some((body, tilted_tail)))
}

/// A composition's PRV in both directions, discretized for a given accuracy; answers any
/// number of ε(δ) / δ(ε) queries.
#[derive(Debug, Clone)]
pub struct ComposedPrv {
    dirs: Vec<ComposedDirection>,
    eps_error: f64,
    delta_error: f64,
}

impl ComposedPrv {
    /// The ε tolerance (target excess of the upper bound over the truth) the grid was built for.
    pub fn eps_error(&self) -> f64 {
        self.eps_error
    }

    /// The δ error budget of the upper bound (truncation + wrap-around).
    pub fn delta_error(&self) -> f64 {
        self.delta_error
    }

    /// Grid step (the finest over member combinations).
    pub fn grid_step(&self) -> f64 {
        self.dirs
            .iter()
            .map(|d| d.h)
            .fold(f64::NAN, |a, b| if a.is_nan() { b } else { a.min(b) })
    }

    /// Grid points of the largest direction.
    pub fn grid_points(&self) -> usize {
        self.dirs
            .iter()
            .map(ComposedDirection::n)
            .max()
            .unwrap_or(0)
    }

    /// ε(δ) bounds (max over both directions and all member combinations).
    pub fn epsilon(&self, delta: f64) -> Result<EpsilonBounds> {
        let delta = Delta::new(delta)?.get();
        let mut out = EpsilonBounds {
            upper: 0.0,
            estimate: 0.0,
            lower: 0.0,
            upper_remove: 0.0,
            upper_add: 0.0,
            method: Method::Prv {
                eps_error: self.eps_error,
            },
        };
        for (i, d) in self.dirs.iter().enumerate() {
            // Pessimistic discretization: δ_Y(ε) ≤ δ_w(ε) + extra_up at every ε, no shift.
            let up = d.eps_upper(delta)?;
            // (A split direction's window holds the clamped losses only: its estimate starts
            // from the certified bound.)
            let raw = if d.split.is_some() {
                up
            } else {
                d.eps_w(delta)
            };
            let est = if raw.is_finite() {
                (raw - d.excess(raw)).max(0.0)
            } else {
                raw.max(0.0)
            };
            let low = d.eps_lower(delta);
            if std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some() {
                eprintln!(
                    "direction {i}: at ε = {up}: FFT and point round-off {:.3e}·δ, pmf tail term {:.3e}·δ, trunc + wrap {:.3e}·δ",
                    3.0 * d.b_up * d.decay(up) / delta,
                    d.pmf_tail(up) / delta,
                    d.extra_up / delta
                );
                if let Some(sp) = &d.split {
                    eprintln!(
                        "direction {i}: split: body {:.4e}·δ, tail terms {:.4e}·δ (constant {:.3e}·δ)",
                        d.body_min(up) / delta,
                        sp.term(up, |part, x| d.less_one(part, x)) / delta,
                        sp.rho2 / delta
                    );
                }
            }
            if !(up.is_finite() && est.is_finite() && low.is_finite()) {
                return Err(AccountantError::NumericalFailure("epsilon query"));
            }
            out.upper = out.upper.max(up);
            out.estimate = out.estimate.max(est);
            out.lower = out.lower.max(low);
            if i % 2 == 0 {
                out.upper_remove = out.upper_remove.max(up);
            } else {
                out.upper_add = out.upper_add.max(up);
            }
        }
        out.estimate = out.estimate.clamp(out.lower, out.upper);
        Ok(out)
    }

    /// δ(ε) bounds (max over both directions and all member combinations).
    pub fn delta(&self, eps: f64) -> Result<DeltaBounds> {
        let eps = Epsilon::new(eps)?.get();
        let mut out = DeltaBounds {
            upper: 0.0,
            estimate: 0.0,
            lower: 0.0,
        };
        for d in &self.dirs {
            let up = d.delta_upper(eps);
            let est = if d.split.is_some() {
                d.delta_upper(eps + d.excess(eps))
            } else {
                d.delta_w(eps + d.excess(eps))
            };
            let low = d.delta_lower(eps);
            out.upper = out.upper.max(up);
            out.estimate = out.estimate.max(est);
            out.lower = out.lower.max(low);
        }
        out.estimate = out.estimate.clamp(out.lower, out.upper);
        Ok(out)
    }

    /// The ε the upper bound spends on its δ allowances (truncation, wrap-around, round-off),
    /// `extra_up / (−δ'(ε))` at ε = `at`, in the direction that attains the largest ε at δ (the
    /// others do not set the reported bound).
    fn allowance_eps(&self, at: f64, delta: f64) -> f64 {
        let worst = self
            .dirs
            .iter()
            .max_by(|a, b| a.eps_w(delta).total_cmp(&b.eps_w(delta)));
        let Some(d) = worst else { return 0.0 };
        let step = (32.0 * d.h).min(0.05 * d.sd).max(4.0 * d.h);
        let slope = (d.delta_w(at - step) - d.delta_w(at + step)) / (2.0 * step);
        let spent = d.extra_up + (1.0 + d.rel) * d.charge(at) + d.rel * delta;
        if slope > 0.0 { spent / slope } else { 0.0 }
    }

    /// The measured curvature R at ε of each flat composition (the larger of its two
    /// directions').
    fn curvatures(&self, eps: f64) -> Vec<f64> {
        self.dirs
            .chunks(2)
            .map(|pair| {
                pair.iter()
                    .map(|d| d.curvature(eps))
                    .fold(0.0_f64, f64::max)
            })
            .collect()
    }
}

/// The PRV accountant.
///
/// ```
/// use raptor_accountant::{Composition, PrvAccountant, SubsampledGaussian};
/// let c = Composition::single(SubsampledGaussian::new(0.01, 1.0)?, 1_000)?;
/// let e = PrvAccountant::default().epsilon(&c, 1e-5)?;
/// assert!(e.lower <= e.estimate && e.estimate <= e.upper);
/// # Ok::<(), raptor_accountant::AccountantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PrvAccountant {
    accuracy: Accuracy,
}

/// Below this δ, ε(δ) queries at a relative tolerance are answered on a fixed ladder of
/// tolerances ([`PrvAccountant::epsilon`]), so that a finer tolerance never loosens the bound.
pub const LADDER_BELOW_DELTA: f64 = 1e-7;

/// The coarsest rung of that ladder (`DEFAULT_RELATIVE_EPS_ERROR·2^7`); relative tolerances
/// above it are answered as given.
pub const LADDER_TOP: f64 = DEFAULT_RELATIVE_EPS_ERROR * 128.0;

/// A relative ε tolerance is relative to max(ε, `RELATIVE_FLOOR`): below ε = 0.01 it is an
/// absolute one (1e-6 at the default 1e-4), so that a tiny ε does not ask for a tiny grid.
pub const RELATIVE_FLOOR: f64 = 0.01;

/// Relative excess target of the first (coarse) pass.
const COARSE_REL: f64 = 3e-3;

impl PrvAccountant {
    /// An accountant with the given accuracy.
    pub fn new(accuracy: Accuracy) -> Result<Self> {
        accuracy.validate()?;
        Ok(Self { accuracy })
    }

    /// The accuracy.
    pub fn accuracy(&self) -> &Accuracy {
        &self.accuracy
    }

    /// ε(δ) of a composition: certified upper bound, estimate, lower bound.
    ///
    /// Every valid query gets a certified answer: where the requested accuracy needs more grid
    /// points than `max_points` allows, the answer comes from the finest grid that fits
    /// ([`EpsilonBounds::method`] gives the tolerance it was built for), and where no PRV grid
    /// fits (or the δ error budget is not small against δ), from the RDP bound
    /// ([`Method::Rdp`]; certified, looser).
    ///
    /// Below δ = [`LADDER_BELOW_DELTA`], a relative tolerance of at most [`LADDER_TOP`] is
    /// answered on a fixed ladder: the tolerance is first rounded down (finer) to the nearest
    /// `DEFAULT_RELATIVE_EPS_ERROR·2^k`, and the answer is the smallest certified bound over
    /// that rung and every coarser rung up to [`LADDER_TOP`]. Each rung's bound is certified,
    /// so their minimum is; and since a finer tolerance evaluates a superset of rungs, asking
    /// for more accuracy can never loosen the bound. (At small δ, the δ allowance of a finer
    /// grid — truncation, wrap-around and round-off terms — can otherwise outgrow what the
    /// finer grid gains.) The estimate is the finest rung's, capped at the upper bound.
    ///
    /// The δ error budget has a ladder of its own below δ = [`LADDER_BELOW_DELTA`]: a relative
    /// budget below the default [`DEFAULT_DELTA_ERROR_REL`] is rounded down to the nearest
    /// `DEFAULT_DELTA_ERROR_REL·4^−k`, and the answer is the smallest certified bound over that
    /// rung and every larger one up to the default (each answered as above). So a smaller
    /// budget, at or below the default, never loosens the bound either.
    pub fn epsilon(&self, comp: &Composition, delta: f64) -> Result<EpsilonBounds> {
        let delta = Delta::new(delta)?.get();
        self.accuracy.validate()?;
        let rel = self.accuracy.delta_error_rel;
        if !(delta < LADDER_BELOW_DELTA && rel < DEFAULT_DELTA_ERROR_REL) {
            return self.epsilon_eps_ladder(comp, delta);
        }
        let rung = |k: i32| DEFAULT_DELTA_ERROR_REL * 4f64.powi(-k);
        let mut k = 0;
        while rung(k) > rel && k < 64 {
            k += 1;
        }
        let at = |r: f64| {
            PrvAccountant {
                accuracy: Accuracy {
                    delta_error_rel: r,
                    ..self.accuracy
                },
            }
            .epsilon_eps_ladder(comp, delta)
        };
        let mut best = at(rung(k))?;
        for j in (0..k).rev() {
            if let Ok(b) = at(rung(j)) {
                best = best.tightest(&b);
            }
        }
        Ok(best)
    }

    /// [`Self::epsilon`] at the δ error budget as given (the eps_error ladder only).
    fn epsilon_eps_ladder(&self, comp: &Composition, delta: f64) -> Result<EpsilonBounds> {
        match self.accuracy.eps {
            EpsTolerance::Relative(rel) if delta < LADDER_BELOW_DELTA && rel <= LADDER_TOP => {
                let rung = |k: i32| DEFAULT_RELATIVE_EPS_ERROR * 2f64.powi(k);
                let mut k = (rel / DEFAULT_RELATIVE_EPS_ERROR).log2().floor() as i32;
                while rung(k) > rel {
                    k -= 1;
                }
                while rung(k + 1) <= rel {
                    k += 1;
                }
                let at = |r: f64| {
                    PrvAccountant {
                        accuracy: Accuracy {
                            eps: EpsTolerance::Relative(r),
                            ..self.accuracy
                        },
                    }
                    .epsilon_once(comp, delta)
                };
                let mut best = at(rung(k))?;
                let top = (LADDER_TOP / DEFAULT_RELATIVE_EPS_ERROR).log2().round() as i32;
                for j in k + 1..=top {
                    if let Ok(b) = at(rung(j)) {
                        best = best.tightest(&b);
                    }
                }
                Ok(best)
            }
            _ => self.epsilon_once(comp, delta),
        }
    }

    /// [`Self::epsilon`] at the accuracy as given (PRV, else the RDP bound).
    fn epsilon_once(&self, comp: &Composition, delta: f64) -> Result<EpsilonBounds> {
        match self.epsilon_prv(comp, delta) {
            Err(
                err @ (AccountantError::GridTooLarge { .. }
                | AccountantError::DeltaBelowAccuracy { .. }
                | AccountantError::NumericalFailure(_)),
            ) => {
                let Ok(r) = RdpAccountant::default().epsilon(comp, delta) else {
                    return Err(err);
                };
                Ok(EpsilonBounds {
                    upper: r.epsilon,
                    estimate: r.epsilon,
                    lower: 0.0,
                    upper_remove: r.epsilon,
                    upper_add: r.epsilon,
                    method: Method::Rdp { order: r.order },
                })
            }
            other => other,
        }
    }

    /// [`Self::epsilon`] by the PRV alone (grids coarsened to fit `max_points`).
    fn epsilon_prv(&self, comp: &Composition, delta: f64) -> Result<EpsilonBounds> {
        let delta_error = self.accuracy.delta_error_rel * delta;
        let flats = comp.expand(self.accuracy.max_combinations)?;
        let z = (2.0 * (1.0 / delta).ln()).sqrt();
        // Coarse pass: excess COARSE_REL of the RDP ε, curvature from a Gaussian approximation.
        let rdp = RdpAccountant::default()
            .epsilon(comp, delta)?
            .epsilon
            .max(1e-9);
        let mut coarse_tol = COARSE_REL * rdp;
        let prior: Vec<f64> = flats.iter().map(|f| gaussian_curvature(f, z)).collect();
        // The coarse pass is tilted at a saddle-point estimate of ε(δ), the fine pass at each
        // direction's coarse ε.
        let tilt = Tilt::Delta(delta);
        let final_tol = |scale: f64| match self.accuracy.eps {
            EpsTolerance::Absolute(a) => a,
            EpsTolerance::Relative(r) => r * scale.max(RELATIVE_FLOOR),
        };
        // One pass suffices for an absolute tolerance at least as coarse as the first pass's; a
        // relative one needs the first pass's ε as its scale (the RDP ε can be far above it).
        let single = matches!(self.accuracy.eps, EpsTolerance::Absolute(a) if a >= coarse_tol);
        if single {
            coarse_tol = final_tol(rdp);
        }
        // The first pass, on a coarser grid where the limit requires it (up to three tries).
        let mut tries = 0;
        let coarse_prv = loop {
            match self.compose_flats(&flats, coarse_tol, &prior, delta_error, tilt, None) {
                Err(AccountantError::GridTooLarge {
                    suggested_eps_error,
                    ..
                }) if tries < 3 && suggested_eps_error.is_finite() => {
                    coarse_tol = suggested_eps_error.max(2.0 * coarse_tol);
                    tries += 1;
                }
                other => break other?,
            }
        };
        let coarse_prv =
            self.recentre(&flats, coarse_prv, coarse_tol, &prior, delta_error, delta)?;
        let coarse = coarse_prv.epsilon(delta)?;
        let tol = final_tol(coarse.upper);
        if single || tol >= coarse_tol {
            return Ok(coarse);
        }
        let at = coarse.upper.max(coarse.estimate);
        let measured = coarse_prv.curvatures(at);
        // The δ allowances (truncation and round-off) move the upper bound too: the grid gets
        // what they leave of the tolerance (at least half). The coarse pass's allowance is
        // scaled by (coarse_tol/tol)^{1/4}, a margin (it was the growth of the pmf round-off
        // model it replaced; the allowances left, truncation, wrap-around and the FFT's term,
        // hardly depend on h, but the fine pass's tilt and hence its Chernoff factor differ).
        let spent = coarse_prv.allowance_eps(at, delta) * (coarse_tol / tol).powf(0.25);
        let mut grid_tol = (tol - spent).max(0.5 * tol);
        // The fine pass, on the finest grid that fits (the coarse pass's answer if none does).
        for _ in 0..2 {
            let fine = self.refine_flats(
                &flats,
                grid_tol,
                &measured,
                delta_error,
                |d| {
                    // A coarse window that dropped its values at the answer (too steep a tilt
                    // there) has no ε to centre on: the fine pass falls back to the saddle
                    // point.
                    // (A split direction's window holds the body only: its certified ε.)
                    let e = if d.split.is_some() {
                        d.eps_upper(delta).unwrap_or(f64::NAN)
                    } else {
                        d.eps_w(delta)
                    };
                    if e.is_finite() && e >= d.lowest {
                        (Tilt::Eps(e), delta)
                    } else {
                        (Tilt::Delta(delta), delta)
                    }
                },
                &coarse_prv,
                |d| d.eps_upper(delta),
            );
            if let (Some(_), Err(e)) = (std::env::var_os("RAPTOR_ACCOUNTANT_TRACE"), &fine) {
                eprintln!("fine pass at eps_error {grid_tol:.3e}: {e}");
            }
            match fine {
                Ok(prv) => {
                    let prv =
                        self.recentre_split(&flats, prv, grid_tol, &measured, delta_error, delta)?;
                    return prv.epsilon(delta);
                }
                Err(AccountantError::GridTooLarge {
                    suggested_eps_error,
                    ..
                }) if suggested_eps_error < 0.5 * coarse_tol => {
                    grid_tol = suggested_eps_error.max(1.5 * grid_tol);
                }
                Err(AccountantError::GridTooLarge { .. })
                | Err(AccountantError::DeltaBelowAccuracy { .. }) => return Ok(coarse),
                Err(e) => return Err(e),
            }
        }
        Ok(coarse)
    }

    /// δ(ε) of a composition: certified upper bound, estimate, lower bound.
    pub fn delta(&self, comp: &Composition, eps: f64) -> Result<DeltaBounds> {
        let eps = Epsilon::new(eps)?.get();
        self.accuracy.validate()?;
        let scale = eps.max(loss_sd(comp)?);
        let tol = match self.accuracy.eps {
            EpsTolerance::Absolute(a) => a,
            EpsTolerance::Relative(r) => r * scale.max(1e-9),
        };
        let flats = comp.expand(self.accuracy.max_combinations)?;
        let delta_error = self.accuracy.delta_error_abs;
        let tilt = Tilt::Eps(eps);
        let prior: Vec<f64> = flats
            .iter()
            .map(|f| gaussian_curvature_at(f, eps))
            .collect();
        let coarse_tol = COARSE_REL * scale.max(1e-9);
        if tol >= coarse_tol {
            return self
                .compose_flats(&flats, tol, &prior, delta_error, tilt, None)?
                .delta(eps);
        }
        let coarse = self.compose_flats(&flats, coarse_tol, &prior, delta_error, tilt, None)?;
        let measured = coarse.curvatures(eps);
        self.refine_flats(
            &flats,
            tol,
            &measured,
            delta_error,
            |d| (Tilt::Eps(eps), d.delta_upper(eps)),
            &coarse,
            |d| Ok(d.delta_upper(eps)),
        )?
        .delta(eps)
    }

    /// Discretize and compose both directions for an ε tolerance `eps_error` (the estimated
    /// excess of the upper bound over the truth, absolute) and δ error budget `delta_error`, for
    /// repeated queries. The grid step assumes the curvature of a Gaussian approximation of the
    /// composed loss at δ ≈ 1e-5, and the composition's exponential tilt (module docs,
    /// round-off) is centred at a saddle-point estimate of ε(1e-5): queries far from it stay
    /// certified but lose tightness (far below it the upper bound on δ is 1).
    pub fn compose(
        &self,
        comp: &Composition,
        eps_error: f64,
        delta_error: f64,
    ) -> Result<ComposedPrv> {
        let flats = comp.expand(self.accuracy.max_combinations)?;
        let z = (2.0 * 1e5_f64.ln()).sqrt();
        let prior: Vec<f64> = flats.iter().map(|f| gaussian_curvature(f, z)).collect();
        self.compose_flats(
            &flats,
            eps_error,
            &prior,
            delta_error,
            Tilt::Delta(1e-5),
            None,
        )
    }

    /// Compose every flat composition (both directions) with the grid step for excess `tol` at
    /// curvature `curv[i]`.
    fn compose_flats(
        &self,
        flats: &[Vec<(SubsampledGaussian, u64)>],
        eps_error: f64,
        curv: &[f64],
        delta_error: f64,
        tilt: Tilt,
        hints: Option<&ComposedPrv>,
    ) -> Result<ComposedPrv> {
        self.check_errors(eps_error, delta_error)?;
        let mut dirs = Vec::with_capacity(2 * flats.len());
        let mut total_points = 0usize;
        for (i, flat) in flats.iter().enumerate() {
            let plan = plan_for(
                flat,
                eps_error,
                curv.get(i).copied().unwrap_or(0.0),
                delta_error,
                tilt,
                match tilt {
                    Tilt::Delta(d) => d,
                    Tilt::Eps(_) => f64::NAN,
                },
            );
            let hint = |k: usize| {
                hints
                    .and_then(|p| p.dirs.get(2 * i + k))
                    .map(|d| (d.tilts, d.tilt_hint))
            };
            let (rem, add) = rayon::join(
                || compose_direction(flat, Direction::Remove, &plan, &self.accuracy, hint(0)),
                || compose_direction(flat, Direction::Add, &plan, &self.accuracy, hint(1)),
            );
            let (rem, add) = (rem?, add?);
            total_points += rem.n() + add.n();
            self.check_total(total_points, eps_error)?;
            dirs.push(rem);
            dirs.push(add);
        }
        Ok(ComposedPrv {
            dirs,
            eps_error,
            delta_error,
        })
    }

    /// Where a direction's answer to ε(δ) lies at the bottom of its window's usable values
    /// (the tilt was centred far above it: a saddle-point estimate, off for heavy per-step
    /// tails, where the Chernoff bound is loose), compose that direction again on the same grid
    /// step, centred halfway down from the bottom of the usable values to the tangent
    /// extrapolation of `ln δ_w` there down to δ (at or below the answer where `ln δ` is
    /// convex). Up to six rounds per direction; a composition replaces the previous one only where its certified bound is
    /// smaller (each is certified), so this changes the tightness only.
    fn recentre(
        &self,
        flats: &[Vec<(SubsampledGaussian, u64)>],
        mut prv: ComposedPrv,
        eps_error: f64,
        curv: &[f64],
        delta_error: f64,
        delta: f64,
    ) -> Result<ComposedPrv> {
        for j in 0..prv.dirs.len() {
            let Some(flat) = flats.get(j / 2) else {
                return Err(AccountantError::NumericalFailure("direction index"));
            };
            for _ in 0..6 {
                let d = &prv.dirs[j];
                let low = d.lowest;
                if !(low.is_finite() && d.eps_w(delta) <= low + d.h) {
                    break;
                }
                let step = (16.0 * d.h).max(1e-3 * low.abs());
                let (a, b) = (d.delta_w(low), d.delta_w(low + step));
                let slope = (a / b).ln() / step;
                let tangent = if a > 0.0 && b > 0.0 && slope > 0.0 && slope.is_finite() {
                    low - (delta / a).ln().max(0.0) / slope
                } else {
                    0.0
                };
                // Halfway down to the tangent's point: where ln δ bends sharply (a narrow bulk
                // below heavy single-step tails), the tangent lies far below the answer, and a
                // centre there loses the tilt the answer needs.
                let centre = (0.5 * (tangent.max(0.0) + low)).min(low - d.h).max(0.0);
                let plan = plan_for(
                    flat,
                    eps_error,
                    curv.get(j / 2).copied().unwrap_or(0.0),
                    delta_error,
                    Tilt::Eps(centre),
                    delta,
                );
                let dir = if j % 2 == 0 {
                    Direction::Remove
                } else {
                    Direction::Add
                };
                let new = compose_direction(flat, dir, &plan, &self.accuracy, None)?;
                if new.eps_upper(delta)? < d.eps_upper(delta)? {
                    prv.dirs[j] = new;
                } else {
                    break;
                }
            }
        }
        Ok(prv)
    }

    /// A split direction (method 8) of the fine pass is centred on its coarse pass's certified
    /// ε, which can lie far above the answer where the coarse grid is loose (q 1e-6, δ 1e-8:
    /// 0.00120 against 0.000797); the answer then lies far below the tilt's reference index and
    /// the FFT's round-off charge there, growing as `e^{λ(k_ref − k0)}` below it, can take
    /// much of the tolerance (8e-4·δ there, 1.07 tight tolerances). Where the charge at the
    /// answer moves ε by more than [`RECENTRE_SHARE`] of the grid's tolerance and the answer
    /// lies below the reference index, that direction is composed again on the same grid step,
    /// centred halfway between its answer and the old centre (centred on the answer itself, the
    /// tail steps' share of the tilted sum can fall below the split's trigger, and the unsplit
    /// composition answers, far looser); the new composition replaces the old only where its
    /// certified bound is smaller (each is certified), so this changes the tightness only.
    fn recentre_split(
        &self,
        flats: &[Vec<(SubsampledGaussian, u64)>],
        mut prv: ComposedPrv,
        eps_error: f64,
        curv: &[f64],
        delta_error: f64,
        delta: f64,
    ) -> Result<ComposedPrv> {
        for j in 0..prv.dirs.len() {
            let Some(flat) = flats.get(j / 2) else {
                return Err(AccountantError::NumericalFailure("direction index"));
            };
            let d = &prv.dirs[j];
            if d.split.is_none() || d.lambda <= 0.0 {
                continue;
            }
            let Ok(e) = d.eps_upper(delta) else { continue };
            // The charge moves ε by about charge/(δ·μ), μ = λ/h the tilt per unit of ε.
            let charge = (1.0 + d.rel) * d.charge(e);
            let moves = charge / (delta * d.lambda / d.h);
            if !(e < d.k_ref * d.h && moves > RECENTRE_SHARE * eps_error) {
                continue;
            }
            // On the same grid step (the fine pass may have used a coarser one that keeps the
            // tilt).
            let mut plan = plan_for(
                flat,
                eps_error,
                curv.get(j / 2).copied().unwrap_or(0.0),
                delta_error,
                Tilt::Eps(0.5 * (e + d.k_ref * d.h)),
                delta,
            );
            plan.h = d.h;
            let dir = if j % 2 == 0 {
                Direction::Remove
            } else {
                Direction::Add
            };
            let Ok(new) = compose_direction(flat, dir, &plan, &self.accuracy, None) else {
                continue;
            };
            if std::env::var_os("RAPTOR_ACCOUNTANT_TRACE").is_some() {
                eprintln!(
                    "direction {j}: recentred on {e:.9e} (charge {:.3e}·δ, h {:.3e}, centre {:.6e}, tilt {:.3e}): {:?}",
                    charge / delta,
                    d.h,
                    d.k_ref * d.h,
                    d.lambda,
                    new.eps_upper(delta)
                );
            }
            if let Ok(v) = new.eps_upper(delta)
                && v < e
            {
                prv.dirs[j] = new;
            }
        }
        Ok(prv)
    }

    /// The fine pass, direction by direction, skipping the directions that cannot set the
    /// reported bound: the directions (both adjacency directions of every member combination)
    /// are taken in decreasing order of their coarse upper bound `upper(coarse)`; a direction
    /// is composed on the fine grid unless its coarse upper bound is already at most the largest
    /// fine upper bound found so far, in which case its coarse composition is kept. Sound: the
    /// reported value is the maximum over directions of certified upper bounds, and a coarse
    /// composition certifies its direction as well as a fine one (only less tightly), so the
    /// maximum is unchanged wherever a direction was skipped. The coarse lower bounds and
    /// estimates of skipped directions stay valid (a lower bound of any direction is a lower
    /// bound of the maximum).
    #[allow(clippy::too_many_arguments)]
    fn refine_flats(
        &self,
        flats: &[Vec<(SubsampledGaussian, u64)>],
        eps_error: f64,
        curv: &[f64],
        delta_error: f64,
        tilt_of: impl Fn(&ComposedDirection) -> (Tilt, f64),
        coarse: &ComposedPrv,
        upper: impl Fn(&ComposedDirection) -> Result<f64>,
    ) -> Result<ComposedPrv> {
        self.check_errors(eps_error, delta_error)?;
        let mut order: Vec<(usize, f64)> = Vec::with_capacity(coarse.dirs.len());
        for (j, d) in coarse.dirs.iter().enumerate() {
            order.push((j, upper(d)?));
        }
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut dirs: Vec<Option<ComposedDirection>> = vec![None; coarse.dirs.len()];
        let mut bar = f64::NEG_INFINITY;
        let mut total_points = 0usize;
        for (j, coarse_upper) in order {
            let (Some(flat), Some(coarse_dir)) = (flats.get(j / 2), coarse.dirs.get(j)) else {
                return Err(AccountantError::NumericalFailure("direction index"));
            };
            let d = if coarse_upper <= bar {
                coarse_dir.clone()
            } else {
                let (tilt, delta_hint) = tilt_of(coarse_dir);
                let mut plan = plan_for(
                    flat,
                    eps_error,
                    curv.get(j / 2).copied().unwrap_or(0.0),
                    delta_error,
                    tilt,
                    delta_hint,
                );
                let dir = if j % 2 == 0 {
                    Direction::Remove
                } else {
                    Direction::Add
                };
                let hint = Some((coarse_dir.tilts, coarse_dir.tilt_hint));
                let mut d = compose_direction(flat, dir, &plan, &self.accuracy, hint)?;
                let mut best = upper(&d)?;
                // Where the grid limit cost the fine grid its tilt, a coarser fine grid that
                // keeps it can be tighter (heavy per-step tails at small δ).
                if d.coarser > 1.0 && plan.h * d.coarser < coarse_dir.h {
                    plan.h *= 1.05 * d.coarser;
                    let d2 = compose_direction(flat, dir, &plan, &self.accuracy, hint)?;
                    let u2 = upper(&d2)?;
                    if u2 < best {
                        (d, best) = (d2, u2);
                    }
                }
                // Both compositions certify this direction: keep the tighter (a finer accuracy
                // never loosens the bound the coarse pass already certified).
                if coarse_upper <= best {
                    (d, best) = (coarse_dir.clone(), coarse_upper);
                }
                bar = bar.max(best);
                d
            };
            total_points += d.n();
            self.check_total(total_points, eps_error)?;
            dirs[j] = Some(d);
        }
        Ok(ComposedPrv {
            dirs: dirs.into_iter().flatten().collect(),
            eps_error,
            delta_error,
        })
    }

    fn check_errors(&self, eps_error: f64, delta_error: f64) -> Result<()> {
        self.accuracy.validate()?;
        if !(eps_error.is_finite() && eps_error > 0.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "eps_error",
                value: eps_error,
                reason: "must be positive and finite",
            });
        }
        if !(delta_error.is_finite() && delta_error > 0.0 && delta_error < 1.0) {
            return Err(AccountantError::InvalidAccuracy {
                name: "delta_error",
                value: delta_error,
                reason: "must lie in (0, 1)",
            });
        }
        Ok(())
    }

    fn check_total(&self, total_points: usize, eps_error: f64) -> Result<()> {
        if total_points > 2 * self.accuracy.max_points {
            return Err(grid_too_large(
                total_points as f64,
                2 * self.accuracy.max_points,
                eps_error,
            ));
        }
        Ok(())
    }
}

/// The grid plan of one flat composition for excess `eps_error` at curvature `r`.
fn plan_for(
    flat: &[(SubsampledGaussian, u64)],
    eps_error: f64,
    r: f64,
    delta_error: f64,
    tilt: Tilt,
    delta_hint: f64,
) -> Plan {
    let n_steps: f64 = flat.iter().map(|(_, t)| *t as f64).sum();
    // Never coarser than a tenth of the composed loss's spread.
    let sd = flat_sd(flat);
    let h = grid_step(eps_error, n_steps, r).min(0.1 * sd.max(1e-6));
    Plan {
        h,
        tilt,
        eps_error,
        delta_hint,
        eta: 0.5 * delta_error,
        tail_mass: 0.4 * delta_error / n_steps,
        tau: 0.2 * delta_error,
    }
}

/// Approximate per-step variances of the privacy loss, summed: the composed loss's variance.
fn flat_sd(flat: &[(SubsampledGaussian, u64)]) -> f64 {
    flat.iter()
        .map(|(m, t)| {
            let (q, s) = (m.q(), m.sigma());
            let per = (q * q * (1.0 / (s * s)).exp_m1()).min(1.0 / (s * s));
            per * *t as f64
        })
        .sum::<f64>()
        .sqrt()
}

/// Curvature R of a Gaussian approximation N(s²/2, s²) of the composed loss at the quantile z
/// of the tail: about 1 + z/s.
fn gaussian_curvature(flat: &[(SubsampledGaussian, u64)], z: f64) -> f64 {
    1.0 + z / flat_sd(flat).max(1e-9)
}

/// Curvature R of a Gaussian approximation of the composed loss at ε.
fn gaussian_curvature_at(flat: &[(SubsampledGaussian, u64)], eps: f64) -> f64 {
    let s = flat_sd(flat).max(1e-9);
    let z = ((eps - 0.5 * s * s) / s).max(1.0);
    1.0 + z / s
}

/// Approximate standard deviation of the composed privacy loss (the grid's natural scale).
fn loss_sd(comp: &Composition) -> Result<f64> {
    let flats = comp.expand(1 << 16)?;
    Ok(flats.iter().map(|f| flat_sd(f)).fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use realfft::RealFftPlanner;

    /// E[Y] by brute-force quadrature in x (the output space).
    fn mean_by_quadrature(loss: Loss) -> f64 {
        let s = loss.sigma;
        let (lo, hi, n) = (-30.0 * s - 1.0, 30.0 * s + 2.0, 2_000_000);
        let dx = (hi - lo) / n as f64;
        let mut m = 0.0;
        for i in 0..n {
            let x = lo + (i as f64 + 0.5) * dx;
            let px = match loss.dir {
                Direction::Remove => {
                    (1.0 - loss.q) * norm_pdf(x / s) + loss.q * norm_pdf((x - 1.0) / s)
                }
                Direction::Add => norm_pdf(x / s),
            } / s;
            let y = match loss.dir {
                Direction::Remove => loss.g(x),
                Direction::Add => -loss.g(x),
            };
            m += px * y * dx;
        }
        m
    }

    fn grid_mean(p: &GridPmf, h: f64) -> f64 {
        p.p.iter()
            .enumerate()
            .map(|(k, v)| v * (p.offset + k as i64) as f64 * h)
            .sum()
    }

    /// The pessimistic pmf is a distribution and keeps E[e^{−Y}] = 1 (the Q-mass) up to the
    /// truncated tails: the split solves both mass equations in every bin. Randomized rounding
    /// (which keeps E[Y] instead) is off by ~h²/8 here and fails.
    #[test]
    fn pmf_is_a_distribution_and_keeps_the_q_mass() {
        for &(q, s, h) in &[
            (0.05, 1.2, 1e-3),
            (0.01, 1.0, 2e-4),
            (0.5, 0.6, 0.05),
            (1.0, 2.0, 0.3),
        ] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let p = build_pmf(loss, h, 1e-14, 1 << 24, 0.01).unwrap();
                let total: f64 = p.p.iter().sum();
                assert!((total - 1.0).abs() < 1e-12, "q={q} s={s} {dir:?}: {total}");
                let qmass: f64 =
                    p.p.iter()
                        .enumerate()
                        .map(|(k, v)| v * (-((p.offset + k as i64) as f64 * h)).exp())
                        .sum();
                // E_P[e^{−Y}] = 1; the clamp moves the tails to the grid's ends.
                let (a, b) = (
                    p.offset as f64 * h,
                    (p.offset + p.p.len() as i64 - 1) as f64 * h,
                );
                let (pa, qa) = loss.tails_pq(a, false);
                let (pb, qb) = loss.tails_pq(b, true);
                let want = 1.0 - qa - qb + pa * (-a).exp() + pb * (-b).exp();
                assert!(
                    (qmass - want).abs() < 1e-12,
                    "q={q} s={s} {dir:?}: {qmass} vs {want}"
                );
            }
        }
    }

    /// The grid mean exceeds E[Y] (pessimistic) by at most m* per step, and by about
    /// s(h) ≈ h²/12 when the bins are fine compared with the spread.
    #[test]
    fn pmf_mean_is_pessimistic_by_at_most_m_star() {
        for &(q, s, h, fine) in &[
            (0.5, 0.5, 1.7, false),
            (1e-4, 0.5, 4e-5, false),
            (0.01, 1.0, 2e-3, true),
            (0.25, 8.0, 1e-3, false),
            (0.05, 2.0, 0.3, false),
            (1.0, 1.0, 0.02, true),
        ] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let p = build_pmf(loss, h, 1e-14, 1 << 24, 0.01).unwrap();
                let mean = mean_by_quadrature(loss);
                let shift = grid_mean(&p, h) - mean;
                let tol = 1e-10 * mean.abs() + 1e-13;
                assert!(
                    shift >= -tol && shift <= max_round_up(h) + tol,
                    "q={q} s={s} h={h} {dir:?}: shift {shift:e}, m* {:e}",
                    max_round_up(h)
                );
                if fine {
                    let s_h = mean_shift(h);
                    assert!(
                        (shift - s_h).abs() < 0.1 * s_h,
                        "q={q} s={s} h={h} {dir:?}: shift {shift:e} vs s(h) {s_h:e}"
                    );
                }
            }
        }
    }

    /// One step: the discrete δ equals the exact δ(ε) = P(Y > ε) − e^ε Q(Y > ε) at every grid
    /// point ε = kh (connect the dots: the chords meet the curve there) and exceeds it between
    /// grid points.
    #[test]
    fn one_step_delta_is_exact_on_the_grid_and_above_between() {
        for &(q, s, h) in &[
            (0.01, 0.7, 1e-3),
            (0.1, 1.0, 0.01),
            (0.5, 2.0, 0.05),
            (1.0, 1.5, 0.02),
        ] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let p = build_pmf(loss, h, 1e-15, 1 << 24, 0.01).unwrap();
                let disc = |eps: f64| -> f64 {
                    p.p.iter()
                        .enumerate()
                        .map(|(k, v)| {
                            let y = (p.offset + k as i64) as f64 * h;
                            v * (-(eps - y).exp_m1()).max(0.0)
                        })
                        .sum()
                };
                let exact = |eps: f64| -> f64 {
                    let (sp, sq) = loss.tails_pq(eps, true);
                    (sp - eps.exp() * sq).max(0.0)
                };
                for k in 0..40 {
                    let eps = k as f64 * h * 3.0;
                    let (d, e) = (disc(eps), exact(eps));
                    assert!(
                        (d - e).abs() <= 1e-9 * e + 1e-13,
                        "q={q} s={s} {dir:?} eps={eps}: {d:e} vs {e:e}"
                    );
                    let mid = eps + 0.37 * h;
                    let (d, e) = (disc(mid), exact(mid));
                    assert!(
                        d >= e * (1.0 - 1e-9) - 1e-13,
                        "q={q} s={s} {dir:?} eps={mid}: {d:e} < {e:e}"
                    );
                }
            }
        }
    }

    /// The two tails of `tails_pq` agree with `tail` (P) and sum to one; Q(Y > y) = E_P[e^{−Y};
    /// Y > y] by quadrature.
    #[test]
    fn tails_pq_matches_tail_and_quadrature() {
        for &(q, s) in &[(0.01, 1.0), (0.25, 8.0), (1.0, 2.0), (0.5, 0.6)] {
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma: s, dir };
                let (a, b) = loss.support(1e-12);
                for i in 1..20 {
                    let y = a + (b - a) * i as f64 / 20.0;
                    let (fp, fq) = loss.tails_pq(y, false);
                    let (sp, sq) = loss.tails_pq(y, true);
                    assert_eq!(fp, loss.tail(y, false));
                    assert_eq!(sp, loss.tail(y, true));
                    assert!((fp + sp - 1.0).abs() < 1e-14 && (fq + sq - 1.0).abs() < 1e-14);
                    // E_P[e^{−Y}; Y > y] by the midpoint rule in the output x, with the loss
                    // and the densities evaluated directly (not through the CDFs).
                    let (lo, hi) = match dir {
                        Direction::Remove => (loss.ginv(y), 30.0 * s + 2.0),
                        Direction::Add => (-30.0 * s - 1.0, loss.ginv(-y)),
                    };
                    let lo = lo.max(-30.0 * s - 1.0);
                    let n = 200_000;
                    let dx = (hi - lo) / n as f64;
                    let mut acc = 0.0;
                    for k in 0..n {
                        let x = lo + (k as f64 + 0.5) * dx;
                        let p0 = norm_pdf(x / s) / s;
                        let (px, yx) = match dir {
                            Direction::Remove => {
                                ((1.0 - q) * p0 + q * norm_pdf((x - 1.0) / s) / s, loss.g(x))
                            }
                            Direction::Add => (p0, -loss.g(x)),
                        };
                        acc += px * (-yx).exp() * dx;
                    }
                    assert!(
                        (acc - sq).abs() <= 1e-6 * sq + 1e-12,
                        "q={q} s={s} {dir:?} y={y}: {acc:e} vs {sq:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn round_up_bounds_are_consistent() {
        for &h in &[1e-5_f64, 1e-3, 0.05, 0.5, 2.0] {
            let r = h / (-(-h).exp_m1());
            let m_star = (r - 1.0) - r.ln();
            assert!(m_star <= max_round_up(h) * (1.0 + 1e-9), "h={h}");
            assert!(h > 0.05 || m_star >= 0.9 * max_round_up(h), "h={h}");
            // s(h): the mean of h·π(u) − u over u uniform in [0, h], by quadrature.
            let n = 100_000;
            let mut acc = 0.0;
            for i in 0..n {
                let u = (i as f64 + 0.5) * h / n as f64;
                acc += h * (-(-u).exp_m1()) / (-(-h).exp_m1()) - u;
            }
            let want = acc / n as f64;
            assert!(
                (mean_shift(h) - want).abs() <= 1e-6 * want,
                "h={h}: {} vs {want}",
                mean_shift(h)
            );
        }
    }

    /// At T = 1000, δ ≈ 1e-12 (where the untilted FFT's absolute round-off, ~1e-13, used to
    /// swamp δ): the tilted composition's round-off bound is below 0.1 % of δ (mostly the
    /// FFT's term; this heavy-tailed case keeps the tilt's Chernoff factor far above δ; the
    /// modelled pmf term that this bound replaced made it 0.5 %), and δ_w of six
    /// grids converges as the pessimistic excess (∝ h² ∝ tol) predicts, successive differences
    /// shrinking by the ratio of the tolerances (3.33, 3): no round-off scatter is visible down
    /// to differences of 1.7e-16 (the untilted FFT scattered by ~1e-13 here).
    #[test]
    fn tilted_round_off_bound_is_relative_to_delta_and_grids_converge() {
        let c = Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 1000).unwrap();
        let acc = PrvAccountant::default();
        let flats = c.expand(256).unwrap();
        let eps = 3.91;
        let mut vals = Vec::new();
        let mut bounds = Vec::new();
        for tol in [1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5] {
            // The unsplit tilted composition of the remove direction (what `compose_flats`
            // composes besides the split one, method 8).
            let plan = plan_for(&flats[0], tol, 20.0, 1e-17, Tilt::Eps(eps), f64::NAN);
            let loss = Loss {
                q: 0.01,
                sigma: 1.0,
                dir: Direction::Remove,
            };
            let max_points = acc.accuracy.max_points;
            let pmf = build_pmf(loss, plan.h, plan.tail_mass, max_points, tol).unwrap();
            let d = &compose_pmfs(
                &[(pmf, 1000.0)],
                Direction::Remove,
                &plan,
                max_points,
                None,
                std::time::Instant::now(),
            )
            .unwrap();
            assert!(d.lambda > 0.0 && eps >= d.lowest);
            let v = d.delta_w(eps);
            vals.push(v);
            bounds.push(d.charge(eps) + d.rel * v);
        }
        let lo = vals.iter().fold(f64::INFINITY, |a, &v| a.min(v));
        assert!(lo > 5e-13 && vals[0] < 2e-12, "{vals:?}");
        let worst_bound = bounds.iter().fold(0.0_f64, |a, &b| a.max(b));
        // The untilted bound (absolute, ~N·1e-15) would exceed δ here.
        eprintln!("round-off bound / δ: {:.3e}", worst_bound / lo);
        assert!(worst_bound < 1e-3 * lo, "{bounds:?} vs {vals:?}");
        let diffs: Vec<f64> = vals.windows(2).map(|p| p[0] - p[1]).collect();
        for p in diffs.windows(2) {
            let ratio = p[0] / p[1];
            assert!((2.4..4.5).contains(&ratio), "{diffs:?} ({vals:?})");
        }
    }

    /// `a * b` of two non-negative sequences by direct summation (every term non-negative, so
    /// each entry carries a relative error of at most about `len·ε_mach`: a reference for the
    /// FFT's round-off in the far tail, where the FFT's absolute error dominates).
    fn direct_conv(a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; a.len() + b.len() - 1];
        for (i, &x) in a.iter().enumerate() {
            if x == 0.0 {
                continue;
            }
            for (j, &y) in b.iter().enumerate() {
                out[i + j] += x * y;
            }
        }
        out
    }

    /// The round-off bound covers the FFT's actual error, against an exact reference: T = 64
    /// steps composed by the FFT and by direct non-negative convolution (binary powering:
    /// relative error below 1e-12 per entry) of the same grid pmf, δ compared from 1e-2 down
    /// to the far tail. Untilted (λ = 0), the FFT's absolute error (~1e-17) exceeds 1e-3 of δ
    /// in the far tail and the (absolute) bound still covers it; tilted at δ ≈ 1e-12, the error
    /// and its bound are relative to δ there (the bound below 1e-5 of δ, the error below 1e-9).
    #[test]
    fn round_off_bound_covers_the_fft_error_against_direct_convolution() {
        let steps = 64u64;
        let m = SubsampledGaussian::new(0.1, 0.8).unwrap();
        let h = 4e-3;
        let acc = Accuracy::default();
        let loss = Loss {
            q: 0.1,
            sigma: 0.8,
            dir: Direction::Remove,
        };
        let pmf = build_pmf(loss, h, 1e-32, acc.max_points, 1e-3).unwrap();
        // Reference: pmf^{*64} by repeated squaring (64 = 2^6).
        let mut w = pmf.p.clone();
        for _ in 0..6 {
            w = direct_conv(&w, &w);
        }
        let off = pmf.offset * steps as i64;
        let delta_ref = |eps: f64| {
            let mut s = 0.0;
            for (k, &v) in w.iter().enumerate() {
                let y = (off + k as i64) as f64 * h;
                if y > eps {
                    s += v * -(eps - y).exp_m1();
                }
            }
            s
        };
        // The tilted composition is centred near ε = 17 (δ ≈ 3e-12), as a fine pass is.
        for (tilt, untilted) in [(Tilt::Eps(0.0), true), (Tilt::Eps(17.0), false)] {
            let plan = Plan {
                h,
                tilt,
                eps_error: 1e-3,
                delta_hint: f64::NAN,
                eta: 1e-30,
                tail_mass: 1e-32,
                tau: 1e-32,
            };
            let d = compose_direction(&[(m, steps)], Direction::Remove, &plan, &acc, None).unwrap();
            assert_eq!(d.lambda == 0.0, untilted);
            let mut worst_rel = 0.0_f64;
            let mut eps = 0.5;
            while eps < 30.0 {
                if eps >= d.lowest {
                    let (fft, exact) = (d.delta_w(eps), delta_ref(eps));
                    let bound = (1.0 + d.rel) * 3.0 * d.b_up * d.decay(eps) + d.rel * exact;
                    let err = (fft - exact).abs();
                    assert!(
                        err <= bound + 1e-12 * exact,
                        "{tilt:?} eps={eps}: FFT error {err:e} above the bound {bound:e} (δ {exact:e})"
                    );
                    if (1e-13..1e-11).contains(&exact) {
                        worst_rel = worst_rel.max(err / exact);
                        if !untilted {
                            assert!(bound < 1e-5 * exact, "{eps}: {bound:e} vs {exact:e}");
                        }
                    }
                    if exact > 0.0 && exact < 1e-14 && untilted {
                        worst_rel = worst_rel.max(err / exact);
                    }
                }
                eps += 0.1;
            }
            if untilted {
                assert!(
                    worst_rel > 1e-3,
                    "untilted FFT error not visible: {worst_rel:e}"
                );
            } else {
                assert!(worst_rel < 1e-9, "tilted relative error {worst_rel:e}");
            }
        }
    }

    /// The split composition (method 8) against an exact reference: T = 64 steps of the same
    /// grid pmf composed by direct non-negative convolution. Its certified δ is never below
    /// the reference's δ (the expansion by the number of tail steps is exact for the grid pmf;
    /// the tail's masses are bracketed upward, the k = 2 term bounded through the body less
    /// one step, k ≥ 3 bounded), and within 1e-3 of it from δ ≈ 1e-2 down to max(1e-13, 10τ)
    /// (plus the constant k ≥ 3 term and the body's truncation and wrap-around charge) above
    /// the window's usable values (the tilt is centred at
    /// ε = 2, δ ≈ 1e-11). Returns the constant term, the length of the k = 2 table, T·π and
    /// the number of checked points where the k ≥ 2 bound (Tπ)²/2 of a cut at T·π = √τ would
    /// have exceeded ten times the tolerance.
    fn check_split_against_direct(tau: f64) -> (f64, usize, f64, usize) {
        let steps = 64u64;
        let m = SubsampledGaussian::new(1e-3, 0.8).unwrap();
        let h = 2e-3;
        let acc = Accuracy::default();
        let loss = Loss {
            q: 1e-3,
            sigma: 0.8,
            dir: Direction::Remove,
        };
        let plan = Plan {
            h,
            tilt: Tilt::Eps(2.0),
            eps_error: 1e-3,
            delta_hint: f64::NAN,
            eta: 1e-30,
            tail_mass: 1e-32,
            tau,
        };
        let pmf = build_pmf(loss, h, plan.tail_mass, acc.max_points, 1e-3).unwrap();
        let mut w = pmf.p.clone();
        for _ in 0..6 {
            w = direct_conv(&w, &w);
        }
        let off = pmf.offset * steps as i64;
        let delta_ref = |eps: f64| {
            let mut s = 0.0;
            for (k, &v) in w.iter().enumerate() {
                let y = (off + k as i64) as f64 * h;
                if y > eps {
                    s += v * -(eps - y).exp_m1();
                }
            }
            s
        };
        let pmfs = vec![(pmf, steps as f64)];
        let (d, share) = split_direction(
            &[(m, steps)],
            &pmfs,
            Direction::Remove,
            &plan,
            &acc,
            None,
            std::time::Instant::now(),
        )
        .unwrap()
        .expect("the split applies");
        assert!(share >= SPLIT_TRIGGER);
        let rho2 = d.split.as_ref().map_or(f64::NAN, |sp| sp.rho2);
        assert!(rho2 < tau, "{rho2:e}");
        let (pair_len, t_pi) = d.split.as_ref().map_or((0, f64::NAN), |sp| {
            (sp.parts[0].pair.len(), sp.parts[0].t * sp.parts[0].tails[0])
        });
        // The k ≥ 2 bound of the √τ cut, (Tπ)²/2, against the tolerance checked below.
        let mut old_bound_exceeds = 0usize;
        let mut eps = 0.5;
        let mut checked = 0;
        while eps < 30.0 {
            let (up, exact) = (d.delta_upper(eps), delta_ref(eps));
            assert!(
                up >= exact * (1.0 - 1e-9),
                "eps={eps}: split {up:e} below the exact {exact:e}"
            );
            if eps >= d.lowest && (1e-13_f64.max(10.0 * tau)..1e-2).contains(&exact) {
                // (Plus the body's constant charge: truncation and wrap-around, 2τ.)
                assert!(
                    up <= exact * (1.0 + 1e-3) + rho2 + d.extra_up,
                    "eps={eps}: split {up:e} vs exact {exact:e}"
                );
                checked += 1;
                if 0.5 * t_pi * t_pi > 10.0 * (1e-3 * exact + rho2 + d.extra_up) {
                    old_bound_exceeds += 1;
                }
            }
            eps += 0.02;
        }
        assert!(checked >= 20, "{checked} points above {}", d.lowest);
        (rho2, pair_len, t_pi, old_bound_exceeds)
    }

    /// [`check_split_against_direct`] at a small δ budget (τ = 1e-20: the cut lies far out).
    #[test]
    fn split_bound_covers_the_direct_convolution_and_is_tight() {
        let (_, pair_len, _, _) = check_split_against_direct(1e-20);
        assert!(pair_len > 0);
    }

    /// [`check_split_against_direct`] with τ = 1e-12: the cut at T·π = (3τ)^{1/3} ≈ 1.4e-4
    /// (not √τ = 1e-6), where bounding k ≥ 2 as a whole, (Tπ)²/2 ≈ 1e-8, would exceed the
    /// tolerance below δ ≈ 1e-5: the k = 2 term counted through the pair masses keeps the
    /// bound sound and within 1e-3 of the exact composition there.
    #[test]
    fn split_with_the_pair_term_covers_the_direct_convolution_and_is_tight() {
        let (rho2, pair_len, t_pi, old_exceeds) = check_split_against_direct(1e-12);
        assert!(pair_len > 0);
        assert!(t_pi > 1e-5, "T·π {t_pi:e}");
        assert!(rho2 <= 1e-12, "{rho2:e}");
        assert!(old_exceeds >= 10, "{old_exceeds}");
    }

    /// The FFT's normwise error, measured against the exact DFT (by direct summation in
    /// compensated arithmetic, small n), stays below the assumed `FFT_LEVEL_C·log2(n)·u` with
    /// room (the constant is an assumption on rustfft's kernels, module docs).
    #[test]
    fn fft_normwise_error_is_below_the_assumed_constant() {
        for &n in &[96usize, 128, 144, 216, 256, 384] {
            let mut planner = RealFftPlanner::<f64>::new();
            let r2c = planner.plan_fft_forward(n);
            // A non-negative pmf-like input with a wide dynamic range.
            let x: Vec<f64> = (0..n)
                .map(|i| {
                    let z = (i as f64 - 0.3 * n as f64) / (0.05 * n as f64);
                    (-0.5 * z * z).exp() + 1e-9 * ((i * 7919) % 13) as f64
                })
                .collect();
            let mut buf = x.clone();
            let mut out = r2c.make_output_vec();
            r2c.process(&mut buf, &mut out).unwrap();
            let (mut err2, mut norm2) = (0.0_f64, 0.0_f64);
            for (j, z) in out.iter().enumerate() {
                // Exact X_j by summation with the angle reduced exactly (i·j mod n).
                let (mut re, mut im) = (0.0_f64, 0.0_f64);
                let (mut cre, mut cim) = (0.0_f64, 0.0_f64);
                for (i, &v) in x.iter().enumerate() {
                    let a = -2.0 * std::f64::consts::PI * ((i * j) % n) as f64 / n as f64;
                    // Kahan summation.
                    let yr = v * a.cos() - cre;
                    let tr = re + yr;
                    cre = (tr - re) - yr;
                    re = tr;
                    let yi = v * a.sin() - cim;
                    let ti = im + yi;
                    cim = (ti - im) - yi;
                    im = ti;
                }
                let m = if j == 0 || (n % 2 == 0 && j == n / 2) {
                    1.0
                } else {
                    2.0
                };
                err2 += m * ((z.re - re).powi(2) + (z.im - im).powi(2));
                norm2 += m * (re * re + im * im);
            }
            let rel = (err2 / norm2).sqrt();
            let assumed = FFT_LEVEL_C * (n as f64).log2() * UNIT_ROUNDOFF;
            // The reference's own error (≈ n·u·max|x|/‖X‖) is included in `rel`.
            assert!(rel < 0.25 * assumed, "n={n}: {rel:e} vs {assumed:e}");
        }
    }

    /// The erfc used (libm's) against 20-digit references (mpmath): within 4u, half the
    /// assumed `ERFC_REL` of the round-off bounds (module docs). statrs 0.18's erfc, used
    /// before, is off by 1.0e-10 relative at x = 0.50856 (and fails this test at x = −2.5).
    #[test]
    fn erfc_is_within_the_assumed_accuracy() {
        let refs = [
            (0.508_560_000_000_034, 0.472_010_029_974_845_6),
            (-5.0, 1.999_999_999_998_462_5),
            (-2.5, 1.999_593_047_982_555),
            (-1.0, 1.842_700_792_949_715),
            (-0.3, 1.328_626_759_459_127_4),
            (0.0, 1.0),
            (0.2, 0.777_297_410_789_521_5),
            (0.5, 0.479_500_122_186_953_5),
            (0.9, 0.203_091_787_577_167_86),
            (1.7, 0.016_209_541_409_225_44),
            (2.5, 0.000_406_952_017_444_959),
            (3.3, 3.057_709_796_438_165e-6),
            (4.4, 4.891_710_270_605_873e-10),
            (5.9, 7.190_409_783_550_478e-17),
            (7.5, 2.776_649_386_030_569e-26),
            (10.0, 2.088_487_583_762_545e-45),
            (14.0, 3.037_229_847_750_311_7e-87),
            (20.0, 5.395_865_611_607_901e-176),
            (26.0, 5.663_192_408_856_143e-296),
        ];
        for (x, want) in refs {
            let got: f64 = libm::erfc(x);
            let rel = (got - want).abs() / want;
            assert!(
                rel <= 0.5 * ERFC_REL,
                "erfc({x}) = {got:e} vs {want:e}: {rel:e}"
            );
        }
    }

    /// The grid pmf's round-off bound (module docs, round-off, 5) against the actual effect of
    /// errors injected into the edge tails: relative errors of size `r` (far above the native
    /// ones), of the worst kind (P-tail up, Q-tail down: inconsistent, and at the switch
    /// creating mass) or alternating from edge to edge, change δ of one step composed with 12
    /// others (direct non-negative convolution) by at most `tail_coef·τ(ε − 3h)` at every ε,
    /// with τ the exact tail of the composition; and the bound is not loose by more than a
    /// factor 100 somewhere (the worst cases reach 5–8 % of it).
    ///
    /// The last two cases (one step of σ = 0.3 without subsampling: P's median loss 5.6) have
    /// Q's tails switch at Q's median, apart from P's switch (`SEPARATE_Q_SWITCH_ABOVE`).
    #[test]
    fn pmf_round_off_bound_covers_injected_tail_errors() {
        let r = 1e-7;
        for &(q, s, h, dir, eps_max, eps_step) in &[
            (0.1, 1.0, 0.02, Direction::Remove, 6.0, 0.25),
            (0.1, 1.0, 0.02, Direction::Add, 6.0, 0.25),
            (0.5, 0.8, 0.05, Direction::Remove, 6.0, 0.25),
            (1.0, 0.3, 0.1, Direction::Remove, 160.0, 2.0),
            (1.0, 0.3, 0.1, Direction::Add, 160.0, 2.0),
        ] {
            let loss = Loss { q, sigma: s, dir };
            let exact = build_pmf(loss, h, 1e-16, 1 << 20, 0.01).unwrap();
            // R: 12 more steps of the unperturbed pmf.
            let mut rw = exact.p.clone();
            for _ in 0..11 {
                rw = direct_conv(&rw, &exact.p);
            }
            let r_off = exact.offset * 12;
            // Q's switch apart from P's exactly in the cases without subsampling (e_sw is
            // e^{y} at Q's switch, ≈ e^{−5.6}, plus 2.02 there; e^{y} at P's switch, below 2,
            // otherwise).
            let e_sw = exact.roundoff.e_sw;
            assert_eq!(
                (2.02..2.1).contains(&e_sw),
                q == 1.0,
                "{:?}",
                exact.roundoff
            );
            let exact_w = direct_conv(&exact.p, &rw);
            let delta_of = |w: &[f64], off: i64, eps: f64| -> (f64, f64) {
                // (δ at ε, P(S ≥ ε)) of p * R (w = p * R).
                let (mut d, mut t) = (0.0, 0.0);
                for (k, &v) in w.iter().enumerate() {
                    let y = (off + r_off + k as i64) as f64 * h;
                    if y > eps {
                        d += v * -(eps - y).exp_m1();
                    }
                    if y >= eps {
                        t += v;
                    }
                }
                (d, t)
            };
            let mut worst_ratio = 0.0_f64;
            for pattern in 0..2 {
                let perturbed = |y: f64, upper: bool| {
                    let mut t = loss.edge_tails(y, upper);
                    let sign = if pattern == 0 || ((y / h).round() as i64) % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    t.p *= 1.0 + sign * r;
                    t.q *= 1.0 - sign * r;
                    t.rel = t.rel * (1.0 + r) + r * (1.0 + 1e-9);
                    t
                };
                let pert = build_pmf_with(loss, h, 1e-16, 1 << 20, 0.01, &perturbed).unwrap();
                assert_eq!(pert.offset, exact.offset);
                let coef = pert.roundoff.tail_coef;
                assert!(pert.roundoff.abs.is_empty(), "{:?}", pert.roundoff.abs);
                let pert_w = direct_conv(&pert.p, &rw);
                let mut eps = 0.0;
                while eps < eps_max {
                    let (de, te) = delta_of(&exact_w, exact.offset, eps);
                    let (dp, tp) = delta_of(&pert_w, pert.offset, eps);
                    let (_, te3) = delta_of(&exact_w, exact.offset, eps - 3.0 * h);
                    let (_, tp3) = delta_of(&pert_w, pert.offset, eps - 3.0 * h);
                    // The native round-off of both pmfs (bounded with `exact`'s coefficient).
                    let native = exact.roundoff.tail_coef * te3.max(tp3);
                    let bound = coef * te3.max(tp3) + native;
                    let err = (dp - de).abs();
                    assert!(
                        err <= bound * (1.0 + 1e-6) + 1e-300,
                        "q={q} s={s} {dir:?} pattern {pattern} eps={eps}: error {err:e} above the bound {bound:e} (δ {de:e}, tails {te:e} {tp:e})"
                    );
                    if de > 1e-30 {
                        worst_ratio = worst_ratio.max(err / bound);
                    }
                    eps += eps_step;
                }
            }
            assert!(
                worst_ratio > 0.01,
                "q={q} s={s} {dir:?}: the bound is loose, worst error/bound {worst_ratio:e}"
            );
            eprintln!("q={q} s={s} {dir:?}: worst error/bound {worst_ratio:.3}");
        }
    }

    /// The loss inversion's backward error bound `d` (module docs, round-off, 5(a)) is small
    /// (≤ 1e-13 relative) and covers the loss recomputed at the inverted point (forward,
    /// with its own rounding allowed for) across the support, in both directions.
    #[test]
    fn loss_inversion_backward_error_is_bounded() {
        let u = UNIT_ROUNDOFF;
        for &(q, s) in &[
            (0.01, 1.0),
            (1e-4, 0.6),
            (0.25, 8.0),
            (0.5, 0.5),
            (1.0, 2.0),
        ] {
            let loss = Loss {
                q,
                sigma: s,
                dir: Direction::Remove,
            };
            let (a, b) = loss.support(1e-20);
            let (a2, b2) = (-b, -a);
            for i in 0..=400 {
                for y in [
                    a + (b - a) * i as f64 / 400.0,
                    a2 + (b2 - a2) * i as f64 / 400.0,
                ] {
                    let (x, d, abs) = loss.ginv_err(y);
                    if x == f64::NEG_INFINITY {
                        assert!(y <= (1.0 - q).ln() + 1e-12 && abs >= 0.0, "q={q} y={y}");
                        continue;
                    }
                    assert!(d <= 1e-13 * y.abs().max(1.0), "q={q} s={s} y={y}: d {d:e}");
                    let back = loss.g(x);
                    let fwd = 16.0 * u * (back.abs() + q.ln().abs() + 1.0);
                    assert!(
                        (back - y).abs() <= d + fwd,
                        "q={q} s={s} y={y}: g(x̂) − y = {:e} vs d {d:e}",
                        back - y
                    );
                }
            }
        }
    }

    /// The fine pass skips a direction whose coarse certified bound cannot set the maximum, and
    /// the reported bound equals the one with both directions refined (a skipped direction's
    /// coarse bound lies below it).
    #[test]
    fn refining_only_the_leading_direction_reports_the_same_bound() {
        let c = Composition::single(SubsampledGaussian::new(0.01, 1.0).unwrap(), 10_000).unwrap();
        let acc = PrvAccountant::new(Accuracy::tight()).unwrap();
        let flats = c.expand(256).unwrap();
        let delta: f64 = 1e-5;
        let delta_error = 1e-5 * delta;
        let z = (2.0 * (1.0 / delta).ln()).sqrt();
        let prior: Vec<f64> = flats.iter().map(|f| gaussian_curvature(f, z)).collect();
        let coarse = acc
            .compose_flats(&flats, 0.018, &prior, delta_error, Tilt::Delta(delta), None)
            .unwrap();
        let tol = 6e-5;
        let full = acc
            .compose_flats(
                &flats,
                tol,
                &prior,
                delta_error,
                Tilt::Delta(delta),
                Some(&coarse),
            )
            .unwrap();
        let part = acc
            .refine_flats(
                &flats,
                tol,
                &prior,
                delta_error,
                |_| (Tilt::Delta(delta), delta),
                &coarse,
                |d| d.eps_upper(delta),
            )
            .unwrap();
        // Here the add direction's coarse bound is below the remove direction's fine bound.
        assert!(part.dirs[1].h > full.dirs[1].h, "add direction refined");
        assert_eq!(part.dirs[0].h, full.dirs[0].h);
        let (a, b) = (full.epsilon(delta).unwrap(), part.epsilon(delta).unwrap());
        assert_eq!(a.upper, b.upper);
        assert!(b.upper_add >= a.upper_add && b.upper_add <= b.upper_remove);
        assert!(b.lower <= a.upper && b.estimate <= b.upper);
    }

    #[test]
    fn remove_gaussian_loss_is_normal() {
        // q = 1: Y ~ N(1/(2σ²), 1/σ²).
        let s = 2.0;
        let loss = Loss {
            q: 1.0,
            sigma: s,
            dir: Direction::Remove,
        };
        let mu = 1.0 / (2.0 * s * s);
        for y in [-1.0, 0.0, 0.3, 1.5] {
            let want = norm_cdf((y - mu) * s);
            assert!((loss.tail(y, false) - want).abs() < 1e-14);
        }
    }

    #[test]
    fn checkpointed_tables_are_bit_identical_to_full_tables() {
        for &(n, h) in &[
            (1usize, 0.1),
            (31, 0.05),
            (32, 0.05),
            (33, 0.05),
            (1000, 1e-3),
        ] {
            // A positive pmf with a bump, plus round-off-like negative entries.
            let w: Vec<f64> = (0..n)
                .map(|i| {
                    let x = (i as f64 - 0.4 * n as f64) / (0.1 * n as f64 + 1.0);
                    (-0.5 * x * x).exp() + if i % 7 == 3 { -1e-17 } else { 0.0 }
                })
                .collect();
            let total: f64 = w.iter().sum();
            let w: Vec<f64> = w.iter().map(|x| x / total).collect();
            let dir = ComposedDirection::new(h, -7, w.clone(), 0.01, 0.0, 0.0);
            // The full tables, as computed before checkpointing.
            let (eh, omeh) = ((-h).exp(), -(-h).exp_m1());
            let (mut a, mut c, mut d) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            let (mut sa, mut sd, mut next_c) = (0.0_f64, 0.0_f64, 0.0_f64);
            for i in (0..n).rev() {
                let ci = if i + 1 < n {
                    omeh * sa + eh * next_c
                } else {
                    0.0
                };
                sa += w[i];
                sd = w[i] + eh * sd;
                (a[i], c[i], d[i]) = (sa, ci, sd);
                next_c = ci;
            }
            for i in 0..n {
                assert_eq!(dir.state(i), (a[i], c[i], d[i]), "n={n} i={i}");
            }
            for k in 0..200 {
                let target = 10f64.powf(-12.0 * k as f64 / 199.0) * c[0].max(1e-300) * 1.5;
                // Binary search on the full table.
                let (mut lo, mut hi) = (0usize, n - 1);
                if c[0] <= target {
                    hi = 0;
                } else {
                    while hi - lo > 1 {
                        let mid = (lo + hi) / 2;
                        if c[mid] <= target { hi = mid } else { lo = mid }
                    }
                }
                let (i, st) = dir.first_below(target);
                assert_eq!(i, hi, "n={n} target={target:e}");
                assert_eq!(st, (a[i], c[i], d[i]));
            }
        }
    }

    /// The ε-dependent round-off term is charged at `k0`, the first grid index that δ_w(ε)
    /// reads (`k0 > ε/h`, module docs, round-off 6): a point mass at index `k` counts in δ_w(ε)
    /// exactly for ε < k·h, and at every such ε in `[(k − 1)h, kh)` the decay is
    /// `e^{−λ(k − k_ref)}`. A decay taken at a lower index would only loosen the bound; one
    /// taken at a higher index would under-charge the round-off of the mass at `k`.
    #[test]
    fn decay_is_taken_at_the_first_grid_index_that_delta_reads() {
        let (h, k, k_lo) = (0.25, 12_i64, 9_i64);
        let mut w = vec![0.0; 8];
        w[(k - k_lo) as usize] = 1.0;
        let mut d = ComposedDirection::new(h, k_lo, w, 0.0, 0.0, 0.0);
        (d.lambda, d.k_ref) = (0.3, 5.0);
        let at = |k0: i64| (-0.3 * (k0 as f64 - 5.0)).exp();
        for f in [0.0, 0.1, 0.5, 0.9, 0.999] {
            let eps = (k - 1) as f64 * h + f * h;
            let expect = -(eps - k as f64 * h).exp_m1();
            assert!(
                (d.delta_w(eps) - expect).abs() <= 1e-15,
                "δ_w({eps}) = {} ≠ {expect}",
                d.delta_w(eps)
            );
            assert_eq!(d.decay(eps), at(k), "ε = {eps}");
        }
        // At ε = k·h the mass at k no longer counts, and the decay moves to k + 1.
        assert_eq!(d.delta_w(k as f64 * h), 0.0);
        assert_eq!(d.decay(k as f64 * h), at(k + 1));
        // Untilted: no decay.
        d.lambda = 0.0;
        assert_eq!(d.decay(1.0), 1.0);
    }

    /// A synthetic composed window: 200 masses decaying by e^{−0.01} per grid point.
    fn decaying_window() -> Vec<f64> {
        (0..200)
            .map(|i| 0.004 * (-0.01 * f64::from(i)).exp())
            .collect()
    }

    /// δ_w(ε) = Σ_k w_k·(1 − e^{ε − kh}) over kh > ε, against that sum term by term, for ε
    /// inside, above and below the window (a composition whose loss is far from 0 has a window
    /// that starts above ε = 0).
    #[test]
    fn delta_w_is_the_direct_sum_below_inside_and_above_the_window() {
        let (h, k_lo) = (0.1, 30_i64);
        let w = decaying_window();
        let d = ComposedDirection::new(h, k_lo, w.clone(), 0.0, 0.0, 0.0);
        for eps in [0.0, 1.234, 2.95, 3.0, 3.05, 7.77, 22.0, 22.85, 23.0, 40.0] {
            let direct: f64 = w
                .iter()
                .enumerate()
                .map(|(i, &v)| ((k_lo + i as i64) as f64 * h, v))
                .filter(|&(y, _)| y > eps)
                .map(|(y, v)| v * -(eps - y).exp_m1())
                .sum();
            let got = d.delta_w(eps);
            assert!(
                (got - direct).abs() <= 1e-12 * direct.max(1e-300),
                "ε = {eps}: δ_w {got:e} vs direct {direct:e}"
            );
        }
    }

    /// τ(x) by the δ-trick: `((1 + rel)·(δ_w(x − Δ) + 3·b_up·decay) + extra_up + κ·chernoff)
    /// / (1 − e^{−Δ})`, each term charged upward, never below the direct tail of the window, and
    /// the Chernoff bound where that is smaller.
    #[test]
    fn tail_bound_charges_every_term_and_covers_the_direct_tail() {
        let (h, k_lo) = (0.1, 0_i64);
        let w = decaying_window();
        let mut d = ComposedDirection::new(h, k_lo, w.clone(), 0.0, 1e-6, 0.0);
        (d.rel, d.dpmf, d.kappa, d.b_up) = (0.125, 0.5, 0.01, 1e-3);
        // λ = 0: the Chernoff factor is e^{ln_ch_ref} = 1 everywhere, and so is the decay of
        // the FFT round-off term 3·b_up.
        for x in [1.0, 4.0, 9.5, 15.0] {
            let y = x - 0.5;
            let want = (1.125 * (d.delta_w(y) + 3e-3) + 1e-6 + 0.01) / -(-0.5_f64).exp_m1();
            let direct: f64 = w
                .iter()
                .enumerate()
                .filter(|&(i, _)| (k_lo + i as i64) as f64 * h >= x)
                .map(|(_, &v)| v)
                .sum();
            let got = d.tail_bound(x);
            assert!(want < 1.0, "x = {x}: {want}");
            assert!(
                (got - want).abs() <= 1e-15 * want,
                "x = {x}: {got} vs {want}"
            );
            assert!(
                got >= direct,
                "x = {x}: {got} below the direct tail {direct}"
            );
        }
        // A Chernoff bound below the δ-trick is taken instead.
        d.ln_ch_ref = -30.0;
        d.kappa = 0.0;
        assert_eq!(d.tail_bound(4.0), (-30.0_f64).exp());
        // With λ > 0 it falls by e^{−λ} per grid step past k_ref: e^{−30 − λ(⌈x/h⌉ − k_ref)}.
        (d.lambda, d.k_ref) = (0.3, 5.0);
        for (x, steps) in [(4.05, 41.0 - 5.0), (5.05, 51.0 - 5.0)] {
            let want = (-30.0_f64 - 0.3 * steps).exp();
            let got = d.tail_bound(x);
            assert!(
                (got - want).abs() <= 1e-12 * want,
                "x = {x}: {got} vs {want}"
            );
        }
    }

    /// The certified δ(ε) of one direction charges every term in the bound's direction:
    /// `(1 + rel)·(δ_w(ε) + 3·b_up·decay(ε) + pmf_tail(ε)) + extra_up` (capped at 1), and 1
    /// below `lowest`,
    /// where the window holds no usable values (the mass dropped there would otherwise be
    /// missing from δ_w). Each term is set far above its round-off size so that a sign or a
    /// boundary that under-charges it shows.
    #[test]
    fn delta_upper_charges_every_term_and_is_one_below_the_usable_window() {
        let (h, k, k_lo) = (0.25, 12_i64, 9_i64);
        let mut w = vec![0.0; 8];
        w[(k - k_lo) as usize] = 0.5;
        let mut d = ComposedDirection::new(h, k_lo, w, 0.0, 0.01, 0.0);
        (d.lambda, d.k_ref, d.rel, d.b_up) = (0.3, 5.0, 0.125, 1e-3);
        let lowest = (k - 1) as f64 * h + 0.5 * h;
        d.lowest = lowest;
        for eps in [lowest, lowest + 0.1 * h, k as f64 * h, (k + 2) as f64 * h] {
            let expect = 1.125 * (d.delta_w(eps) + 3e-3 * d.decay(eps) + d.pmf_tail(eps)) + 0.01;
            assert!(expect < 1.0);
            assert_eq!(d.delta_upper(eps), expect, "ε = {eps}");
        }
        for eps in [lowest - 1e-9, lowest - h, 0.0] {
            assert_eq!(d.delta_upper(eps), 1.0, "ε = {eps} below the usable window");
        }
    }

    /// `eps_upper` answers with (essentially) the smallest ε it certifies, on real
    /// compositions (where the direct inversion or, after a round-off disagreement, the
    /// fallback bisection gives it) and on a synthetic direction where the decaying round-off
    /// term at the first guess exceeds the room (the fallback must run); and it refuses
    /// (typed error) when no ε in the window is certified. Kills mutants of the guess that make
    /// the answer looser, of the check that guards it (an answer whose bound exceeds δ) and of
    /// the fallback's window (an error or an uncertified answer). Mutants that only send a
    /// query to the bisection are equivalent in output.
    #[test]
    fn eps_upper_is_the_smallest_certified_epsilon() {
        let bisections = || EPS_UPPER_BISECTIONS.with(std::cell::Cell::get);
        // Real compositions, both directions: certified, tight to 1e-7 relative.
        let acc = PrvAccountant::default();
        let cases = [
            (0.01, 1.0, 10_000_u64, 1e-5),
            (0.1, 2.0, 1000, 1e-8),
            (0.05, 0.8, 2000, 1e-6),
        ];
        for (q, sigma, t, delta) in cases {
            let c = Composition::single(SubsampledGaussian::new(q, sigma).unwrap(), t).unwrap();
            let p = acc.compose(&c, 1e-4, 1e-5 * delta).unwrap();
            for (k, d) in p.dirs.iter().enumerate() {
                let e = d.eps_upper(delta).unwrap();
                assert!(
                    d.delta_upper(e) <= delta,
                    "q {q} dir {k}: not certified at {e}"
                );
                if e > 0.0 {
                    let below = e * (1.0 - 1e-7);
                    assert!(
                        d.delta_upper(below) > delta,
                        "q {q} dir {k}: {e} is looser than needed ({below} is certified too)"
                    );
                }
            }
        }
        // A synthetic direction (δ_w(1e-3) near ε = 14.7) whose round-off charge
        // 3·b_up·e^{-λ(k0 − k_ref)} exceeds the room at the first guess and decays within a few
        // grid steps: the fallback finds the smallest certified ε.
        let h = 0.05;
        let w: Vec<f64> = (0..400).map(|k| 0.01 * (-0.02 * k as f64).exp()).collect();
        let mut d = ComposedDirection::new(h, 0, w.clone(), 0.0, 0.0, 0.0);
        (d.lambda, d.k_ref, d.b_up) = (0.5, 290.0, 0.01);
        let delta = 1e-3;
        let e0 = d.eps_w(delta);
        assert!(d.charge(e0) > delta, "precondition: the guess must fail");
        let before = bisections();
        let e = d.eps_upper(delta).unwrap();
        assert_eq!(bisections(), before + 1);
        assert!(
            d.delta_upper(e) <= delta,
            "fallback answer {e} not certified"
        );
        assert!(e > e0);
        assert!(
            d.delta_upper(e - 1e-9) > delta,
            "fallback answer {e} looser than needed"
        );
        // A constant charge above δ: nothing in the window is certified.
        let mut d = ComposedDirection::new(h, 0, w, 0.0, 0.0, 0.0);
        (d.lambda, d.b_up) = (0.0, 1e-3);
        match d.eps_upper(1e-3) {
            Err(AccountantError::DeltaBelowAccuracy { .. }) => {}
            other => panic!("expected DeltaBelowAccuracy, got {other:?}"),
        }
    }

    /// The Chernoff and saddle searches take a hint (a coarser grid's λ) only when it is a
    /// usable tilt (finite, > 0): a hint of 0, a negative or a NaN one gives the hint-free
    /// answer. The Chernoff point is a bound only for λ > 0 (a negative λ flips the
    /// inequality). A saddle target at or below the untilted mean, or not finite, gives
    /// λ = 0 (no tilt) rather than a negative tilt.
    /// Edge tails whose backward error exceeds a quarter bin are refused (the round-off
    /// analysis assumes d ≤ h/4), and accepted just below.
    #[test]
    fn a_backward_error_above_a_quarter_bin_is_refused() {
        let loss = Loss {
            q: 0.1,
            sigma: 1.0,
            dir: Direction::Remove,
        };
        let h: f64 = 0.02;
        for (frac, ok) in [(0.3, false), (0.2, true)] {
            let widened = |y: f64, upper: bool| {
                let mut t = loss.edge_tails(y, upper);
                t.d = t.d.max(frac * h);
                t
            };
            let r = build_pmf_with(loss, h, 1e-14, 1 << 24, 0.01, &widened);
            match (ok, r) {
                (true, Ok(p)) => assert!(p.roundoff.d <= 0.25 * h, "{}", p.roundoff.d),
                (false, Err(AccountantError::NumericalFailure(what))) => {
                    assert_eq!(what, "grid pmf round-off")
                }
                (_, other) => panic!("d = {frac}·h: {:?}", other.map(|p| p.roundoff.d)),
            }
        }
    }

    /// A loss inversion whose error it cannot bound is refused: with q below the unit
    /// round-off and a loss just above 0, w = −(1 − q)e^{−y} rounds to −1, so the derivative
    /// bound's denominator is not positive; the inversion must give up (NaN, ∞). Going on
    /// would return x = −∞, which `edge_tails` reads as "no loss at or below y": wrong for a y
    /// inside the support. Both sides of that edge.
    #[test]
    fn loss_inversion_refuses_what_it_cannot_bound() {
        let loss = Loss {
            q: 1e-17,
            sigma: 1.0,
            dir: Direction::Remove,
        };
        let (x, d, abs) = loss.ginv_err(1e-18);
        assert!(
            x.is_nan() && d == f64::INFINITY && abs == 0.0,
            "{x} {d} {abs}"
        );
        // A loss large enough for w to stay above −1: a finite point with a positive bound.
        let (x, d, abs) = loss.ginv_err(1.0);
        assert!(
            x.is_finite() && d > 0.0 && d.is_finite() && abs == 0.0,
            "{x} {d} {abs}"
        );
    }

    #[test]
    fn searches_ignore_unusable_hints_and_targets() {
        let mut parts = Vec::new();
        for dir in [Direction::Remove, Direction::Add] {
            let p = build_pmf(
                Loss {
                    q: 0.1,
                    sigma: 1.0,
                    dir,
                },
                0.02,
                1e-14,
                1 << 24,
                0.01,
            )
            .unwrap();
            parts.push((log_pmf(&p), 200.0));
        }
        for upper in [true, false] {
            let free = chernoff_point_tilted(&parts, 0.01, 12.0, upper, None);
            assert!(free.1 > 0.0 && free.0.is_finite());
            for bad in [0.0, -0.05, f64::NAN, f64::INFINITY] {
                let got = chernoff_point_tilted(&parts, 0.01, 12.0, upper, Some(bad));
                assert_eq!(
                    got.0.to_bits(),
                    free.0.to_bits(),
                    "upper {upper}, hint {bad}"
                );
                assert_eq!(
                    got.1.to_bits(),
                    free.1.to_bits(),
                    "upper {upper}, hint {bad}"
                );
            }
        }
        let m0: f64 = parts.iter().map(|(c, t)| t * c.mean).sum();
        let sd: f64 = parts.iter().map(|(c, t)| t * c.var).sum::<f64>().sqrt();
        for target in [
            m0 - 3.0 * sd,
            m0 - 1e-9,
            m0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert_eq!(saddle_tilt(&parts, target, None), 0.0, "target {target}");
        }
        let target = m0 + 2.0 * sd;
        let free = saddle_tilt(&parts, target, None);
        assert!(free > 0.0);
        for bad in [0.0, -0.05, f64::NAN, f64::INFINITY] {
            let got = saddle_tilt(&parts, target, Some(bad));
            assert_eq!(got.to_bits(), free.to_bits(), "hint {bad}: {got} vs {free}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The small closed forms against their definitions: `exp_up` bounds `e^x` from above
        /// (by at most a factor 1 + x); `mean_shift` is the mean of `hπ(u) − u` over a bin
        /// (Simpson's rule on 2000 panels); `max_round_up` bounds its maximum from above within
        /// a factor 1 + h; `grid_step` solves `(N + 1)h²(1 + R)/12 = 0.8·tol`.
        #[test]
        fn closed_form_helpers_follow_their_definitions(
            x in 0.0f64..700.0,
            h in 1e-4f64..1.0,
            tol in 1e-6f64..1.0,
            n in 1.0f64..1e6,
            r in 0.0f64..10.0,
        ) {
            let x = if x < 350.0 { x / 350.0 * 1.5 } else { x };
            let e = exp_up(x);
            proptest::prop_assert!(e >= x.exp() && e <= x.exp() * (1.0 + x), "exp_up({}) = {}", x, e);
            let omeh = -(-h).exp_m1();
            let m = |u: f64| h * (-(-u).exp_m1()) / omeh - u;
            let panels = 2000;
            let du = h / panels as f64;
            let mut simpson = m(0.0) + m(h);
            for i in 1..panels {
                simpson += if i % 2 == 1 { 4.0 } else { 2.0 } * m(i as f64 * du);
            }
            let mean = simpson * du / 3.0 / h;
            let s = mean_shift(h);
            proptest::prop_assert!((s - mean).abs() <= 1e-9 * mean, "mean_shift({}) = {} vs {}", h, s, mean);
            let peak = (0..=panels).map(|i| m(i as f64 * du)).fold(0.0f64, f64::max);
            let bound = max_round_up(h);
            proptest::prop_assert!(bound >= peak && bound <= (1.0 + h) * peak, "{} vs {}", bound, peak);
            let g = grid_step(tol, n, r);
            let excess = (n + 1.0) * g * g * (1.0 + r) / 12.0;
            proptest::prop_assert!((excess - TOL_AIM * tol).abs() <= 1e-12 * tol);
        }
    }

    /// Pins every term of the round-off analysis and the search outputs that only steer
    /// tightness, rounded to 5 significant digits, on inputs that reach each branch: the
    /// splits of a bin (clamped both ways, no mass, `y0` past `e^{700}`), the inverse loss and
    /// its backward error (above and below 0, at the end of the support, `q = 1`), the edge
    /// tails, each step pmf's round-off summary and MGF drift, the Chernoff and saddle points,
    /// and the composed directions' round-off charges. These terms are of order 1e-13 of δ or
    /// smaller, so no ε or δ a test compares can see a change in them (a mutation that zeroes
    /// the MGF drift was caught by nothing else): any change to a bound formula shows here and
    /// must be reviewed against the module docs (the soundness tests above check that the
    /// bounds cover measured errors; this one checks they are the ones derived).
    #[test]
    fn round_off_terms_and_search_points_are_the_derived_ones() {
        use std::fmt::Write;
        let f = |x: f64| format!("{x:.4e}");
        let mut out = String::new();
        let h: f64 = 0.05;
        let omeh = -(-h).exp_m1();
        for (y0, pm, qm) in [
            (0.7, 0.3, 0.3 * (-0.72_f64).exp()),
            (0.0, 0.2, 0.25),
            (-3.0, 1e-4, 1e-3),
            (2.0, 0.1, 1e-3),
            (0.5, 0.0, 1e-20),
            (0.5, -1e-18, 1e-19),
            (701.0, 1e-300, 1e-305),
            (701.0, 1e-300, -1e-310),
            (750.0, 1e-300, 0.0),
            // e^{y0}·qm in log space, consistent masses (no clamp): the term of its rounding
            // (ts, which includes libm's error on ln qm) dominates m.
            (701.0, 1.4e-19, 5e-324),
        ] {
            let (lo, hi, m) = split_bin(y0, pm, qm, omeh);
            writeln!(
                out,
                "split_bin({y0}, {pm:e}, {qm:e}): {} {} {}",
                f(lo),
                f(hi),
                f(m)
            )
            .unwrap();
        }
        // (`exp_up`, `mean_shift`, `max_round_up` and `grid_step` are checked against their
        // definitions by `closed_form_helpers_follow_their_definitions`; the stages of the FFT
        // composition by the property tests of `compose`.) The loss inversion and edge tails
        // of a mixture (small q) and of a plain Gaussian (q = 1): a second mixture would run
        // the same branches.
        let losses: [(f64, f64); 2] = [(0.01, 0.8), (1.0, 1.5)];
        for &(q, sigma) in &losses {
            let ln1mq = (1.0 - q).ln();
            let mut ys = vec![-3.0, -1e-4, 0.0, 1e-3, 0.5, 4.0, 30.0, 40.0, 200.0];
            if q < 1.0 {
                ys.extend([
                    ln1mq * 0.5,
                    ln1mq * (1.0 - 1e-14),
                    ln1mq * (1.0 - 1e-15),
                    ln1mq,
                    -ln1mq,
                ]);
            }
            for dir in [Direction::Remove, Direction::Add] {
                let loss = Loss { q, sigma, dir };
                for &y in &ys {
                    let (x, d, abs) = loss.ginv_err(y);
                    writeln!(
                        out,
                        "ginv_err q={q} s={sigma} {dir:?} y={y:e}: {} {} {}",
                        f(x),
                        f(d),
                        f(abs)
                    )
                    .unwrap();
                    for upper in [false, true] {
                        let t = loss.edge_tails(y, upper);
                        writeln!(
                            out,
                            "edge_tails upper={upper}: p {} q {} rel {} abs {} d {}",
                            f(t.p),
                            f(t.q),
                            f(t.rel),
                            f(t.abs),
                            f(t.d)
                        )
                        .unwrap();
                    }
                }
            }
        }
        let steps: [(f64, f64, f64); 3] = [(0.05, 1.2, 1e-2), (0.5, 0.6, 0.05), (1.0, 2.0, 0.3)];
        for (q, sigma, h) in steps {
            let omeh = -(-h).exp_m1();
            let mut parts = Vec::new();
            for dir in [Direction::Remove, Direction::Add] {
                let p = build_pmf(Loss { q, sigma, dir }, h, 1e-14, 1 << 24, 0.01).unwrap();
                let r = &p.roundoff;
                let abs_sum: f64 = r.abs.iter().map(|&(_, m)| m).sum();
                writeln!(
                    out,
                    "pmf q={q} s={sigma} h={h} {dir:?}: offset {} len {} trunc {} {} | d {} r_up {} x_low {} r_sw {} e_sw {} pi_sw {} sw_gap {} c_rel {} tail {} abs {}x{}",
                    p.offset, p.p.len(), f(p.trunc_upper), f(p.trunc_lower), f(r.d), f(r.r_up),
                    f(r.x_low), f(r.r_sw), f(r.e_sw), f(r.pi_sw), f(r.sw_gap), f(r.c_rel),
                    f(r.tail_coef), r.abs.len(), f(abs_sum)
                )
                .unwrap();
                for lambda in [0.0, 1e-3, 0.02] {
                    let ln_m =
                        p.p.iter()
                            .enumerate()
                            .map(|(k, v)| v * (lambda * (p.offset + k as i64) as f64).exp())
                            .sum::<f64>()
                            .ln();
                    let (r1, r2) = r.mgf_drift(lambda, h, omeh, ln_m);
                    writeln!(out, "  mgf_drift({lambda}) = {} {}", f(r1), f(r2)).unwrap();
                }
                let lp = log_pmf(&p);
                let (a, b, v) = log_mgf(&lp, 0.01);
                writeln!(
                    out,
                    "  log_pmf mean {} var {}; log_mgf(0.01) {} {} {}",
                    f(lp.mean),
                    f(lp.var),
                    f(a),
                    f(b),
                    f(v)
                )
                .unwrap();
                parts.push((lp, 300.0));
            }
            for upper in [true, false] {
                let (s, l) = chernoff_point(&parts, 1e-6, upper, None);
                writeln!(
                    out,
                    "  chernoff(1e-6, upper={upper}) = {} at {}",
                    f(s),
                    f(l)
                )
                .unwrap();
            }
            let (s, l) = chernoff_point_tilted(&parts, 0.02, 10.0, true, Some(0.05));
            writeln!(out, "  chernoff_tilted = {} at {}", f(s), f(l)).unwrap();
            let st = saddle_tilt(
                &parts,
                parts.iter().map(|(c, t)| c.mean * t).sum::<f64>() * 1.5 + 10.0,
                None,
            );
            writeln!(out, "  saddle_tilt = {}", f(st)).unwrap();
            writeln!(
                out,
                "  saddle_index = {:?}",
                saddle_index(&parts, 1e-6, h).map(f)
            )
            .unwrap();
        }
        // Injected tail errors: one edge whose Q-tail is off by half (its bins' masses become
        // inconsistent: per-bin `abs` terms), and probes off the grid whose backward error is
        // 10x the edges' (the clamped tails fall back to half a bin inside).
        let loss = Loss {
            q: 0.1,
            sigma: 1.0,
            dir: Direction::Remove,
        };
        let h: f64 = 0.02;
        let odd = |y: f64, upper: bool| {
            let mut t = loss.edge_tails(y, upper);
            let k = (y / h).round();
            if y != k * h {
                t.d *= 10.0;
            } else if k as i64 == 25 {
                t.q *= 1.5;
            }
            t
        };
        let p = build_pmf_with(loss, h, 1e-14, 1 << 24, 0.01, &odd).unwrap();
        let r = &p.roundoff;
        let abs_sum: f64 = r.abs.iter().map(|&(_, m)| m).sum();
        writeln!(
            out,
            "injected: offset {} len {} trunc {} {} | d {} x_low {} tail {} abs {}x{}",
            p.offset,
            p.p.len(),
            f(p.trunc_upper),
            f(p.trunc_lower),
            f(r.d),
            f(r.x_low),
            f(r.tail_coef),
            r.abs.len(),
            f(abs_sum)
        )
        .unwrap();
        let omeh = -(-h).exp_m1();
        for lambda in [0.0, 1e-3, 0.02, 0.5] {
            let (r1, r2) = r.mgf_drift(lambda, h, omeh, 0.0);
            writeln!(out, "  mgf_drift({lambda}) = {} {}", f(r1), f(r2)).unwrap();
        }
        // Injected relative errors of the tails (1 %, both sides of the switch): the edge terms
        // r_up and x_low (rel·(p + e^y q)/(1 − rel) below the switch) and what they feed.
        let noisy = |y: f64, upper: bool| {
            let mut t = loss.edge_tails(y, upper);
            t.rel = t.rel.max(0.01);
            t
        };
        let np = build_pmf_with(loss, h, 1e-14, 1 << 24, 0.01, &noisy).unwrap();
        let nr = &np.roundoff;
        writeln!(
            out,
            "injected rel: trunc {} {} | r_up {} x_low {} r_sw {} tail {}",
            f(np.trunc_upper),
            f(np.trunc_lower),
            f(nr.r_up),
            f(nr.x_low),
            f(nr.r_sw),
            f(nr.tail_coef)
        )
        .unwrap();
        for lambda in [0.0, 0.02] {
            let (r1, r2) = nr.mgf_drift(lambda, h, omeh, 0.0);
            writeln!(out, "  mgf_drift({lambda}) = {} {}", f(r1), f(r2)).unwrap();
        }
        // Both injected pmfs composed (ten steps, tilted at ε = 1): the per-bin terms reach the
        // composition's point charge `b` (they dominate its FFT part here), the MGF drift and
        // the pmf mass its Chernoff factor `ln_ch_ref`, the tail coefficients `kappa`.
        let plan = |e: f64| Plan {
            h,
            tilt: Tilt::Eps(e),
            eps_error: 0.01,
            delta_hint: f64::NAN,
            eta: 1e-12,
            tail_mass: 1e-14,
            tau: 1e-12,
        };
        // (Centred at ε = 0, below the mean: untilted, where the pmf's mass enters directly;
        // at ε = 40, past the top of the support: the centre is clamped halfway between the
        // mean and the top.)
        for (name, pmf, plan) in [
            ("injected", &p, plan(1.0)),
            ("injected untilted", &p, plan(0.0)),
            ("injected centred past the top", &p, plan(40.0)),
            ("injected rel", &np, plan(1.0)),
        ] {
            let t0 = std::time::Instant::now();
            let d = compose_pmfs(
                &[(pmf.clone(), 10.0)],
                Direction::Remove,
                &plan,
                1 << 24,
                None,
                t0,
            )
            .unwrap();
            writeln!(
                out,
                "{name} x10: k_lo {} n {} b {} {} kappa {} ln_ch_ref {} lambda {} k_ref {} delta_upper(1) {}",
                d.k_lo,
                d.n(),
                f(d.b_up),
                f(d.b_low),
                f(d.kappa),
                f(d.ln_ch_ref),
                f(d.lambda),
                f(d.k_ref),
                f(d.delta_upper(1.0))
            )
            .unwrap();
        }
        let acc = PrvAccountant::new(Accuracy::relative(2e-3)).unwrap();
        assert_eq!(acc.accuracy(), &Accuracy::relative(2e-3));
        let sg = |q, s| SubsampledGaussian::new(q, s).unwrap();
        let comps = [
            Composition::single(sg(0.01, 1.0), 1000).unwrap(),
            Composition::single(sg(0.2, 3.0), 50)
                .unwrap()
                .with(sg(0.05, 0.9), 400)
                .unwrap(),
        ];
        for (i, c) in comps.iter().enumerate() {
            // The grid-step heuristics (curvature of the Gaussian approximation).
            for flat in c.expand(1 << 16).unwrap() {
                writeln!(
                    out,
                    "composition {i}: sd {} curvature(4.8) {} curvature_at(0.5, 3, 10) {} {} {}",
                    f(flat_sd(&flat)),
                    f(gaussian_curvature(&flat, 4.8)),
                    f(gaussian_curvature_at(&flat, 0.5)),
                    f(gaussian_curvature_at(&flat, 3.0)),
                    f(gaussian_curvature_at(&flat, 10.0))
                )
                .unwrap();
            }
            let dq = acc.delta(c, 2.0).unwrap();
            writeln!(
                out,
                "composition {i}: accountant delta(2) {} {} {}",
                f(dq.upper),
                f(dq.estimate),
                f(dq.lower)
            )
            .unwrap();
            let p = acc.compose(c, 1e-3, 1e-10).unwrap();
            writeln!(
                out,
                "composition {i}: eps_error {} delta_error {} grid_step {} grid_points {}",
                f(p.eps_error()),
                f(p.delta_error()),
                f(p.grid_step()),
                p.grid_points()
            )
            .unwrap();
            for (k, d) in p.dirs.iter().enumerate() {
                writeln!(
                    out,
                    "composition {i} dir {k}: h {} k_lo {} n {} shift_low {} extra {} {} b {} {} kappa {} ln_ch_ref {} dpmf {} lambda {} k_ref {} rel {} lowest {}",
                    f(d.h), d.k_lo, d.n(), f(d.shift_low), f(d.extra_up), f(d.extra_low),
                    f(d.b_up), f(d.b_low), f(d.kappa), f(d.ln_ch_ref), f(d.dpmf), f(d.lambda),
                    f(d.k_ref), f(d.rel), f(d.lowest)
                )
                .unwrap();
            }
            let e = p.epsilon(1e-5).unwrap();
            let dl = p.delta(2.0).unwrap();
            writeln!(
                out,
                "composition {i}: eps(1e-5) {} {} {}; delta(2) {} {} {}",
                f(e.upper),
                f(e.estimate),
                f(e.lower),
                f(dl.upper),
                f(dl.estimate),
                f(dl.lower)
            )
            .unwrap();
        }
        insta::assert_snapshot!(out);
    }
}

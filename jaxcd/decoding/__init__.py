"""Device-side decoding (JAX): the jitted steps that read a tensorized automaton.

This layer sits between the host-side automata (:mod:`jaxcd.automata`, which compile a
constraint to a :class:`~jaxcd.automata.tensorized.TensorizedAutomaton`) and the user
layer (:mod:`jaxcd.api`, :mod:`jaxcd.generation`, :mod:`jaxcd.cli`); it imports the
automaton type, never a model (a language model is passed in, see :mod:`jaxcd.lm`).

- :mod:`~jaxcd.decoding.gcd`: GCD / LCD masks, budget tables and state updates;
- :mod:`~jaxcd.decoding.pgcd`: P-GCD, the HMM × automaton look-ahead;
- :mod:`~jaxcd.decoding.decode`: constrained sampling (none, LCD, GCD) in one program;
- :mod:`~jaxcd.decoding.smc`, :mod:`~jaxcd.decoding.smc_types`: sequential Monte Carlo
  over particles, and its result type;
- :mod:`~jaxcd.decoding.smc_blackbox`, :mod:`~jaxcd.decoding.awrs`: SMC for black-box
  constraints with adaptive weighted rejection sampling (a host loop around jitted steps);
- :mod:`~jaxcd.decoding.resampling`, :mod:`~jaxcd.decoding.sampling`: resamplers and the
  blocked inverse-CDF token sampler;
- :mod:`~jaxcd.decoding.buckets`: shape buckets and stacks, one compiled program per bucket;
- :mod:`~jaxcd.decoding.compile_stats`: counts of JAX traces and XLA compiles.
"""

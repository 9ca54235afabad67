"""The BFCL studies' summaries on hand-made rows: the independent check of constraint
satisfaction (BFCL's own parser on every output: counts per format and satisfied /
unsatisfied) and the accuracy studies' proposal diagnostics (lengths, log Ẑ medians)."""

from experiments.studies import parse_check, parse_check_text


def test_parse_check_counts_parsed_and_unparsable_outputs():
    rows = [
        {"format": "json", "valid": True, "output": '[{"name": "f", "arguments": {"x": 1}}]'},
        {"format": "json", "valid": False, "output": '[{"name": "f", "arguments": {"x": "ab'},
        {"format": "json", "valid": True, "output": '{"name": "f"'},          # a disagreement
        {"format": "python", "valid": True, "output": "[f(x=1, y='a')]"},
        {"format": "python", "valid": False, "output": "[f(x=1, y='a"},
        {"format": "python", "valid": False, "output": "[f(x=1)]"},           # a disagreement
    ]
    c = parse_check(rows)
    assert c["json"] == {"satisfied_parsed": 1, "satisfied_unparsable": 1,
                         "unsatisfied_parsed": 0, "unsatisfied_unparsable": 1}
    assert c["python"] == {"satisfied_parsed": 1, "satisfied_unparsable": 0,
                           "unsatisfied_parsed": 1, "unsatisfied_unparsable": 1}
    text = parse_check_text(c)
    assert "json: 1 of 2 outputs counted satisfied parse" in text
    assert "python: 1 of 1 outputs counted satisfied parse as a call list, 1 of 2" in text
    assert parse_check_text({}) == ""


def test_proposal_diagnostics_against_hand_computed_medians():
    """Mean length and the median per-example log Ẑ difference to the reference method at its
    largest k (non-finite log Ẑ left out), on hand-made rows."""
    import math

    from experiments.studies import diagnostics_md, proposal_diagnostics

    def row(ex, m, k, z, t, n=2):
        args = ", ".join(f'"a{i}": {i}' for i in range(n))
        return {"format": "json", "id": ex, "method": m, "particles": k, "log_Z": z, "tokens": t,
                "output": '[{"name": "f", "arguments": {' + args + '}}]'}
    rows = [row("a", "smc-gcd", 1, -9.0, 40), row("a", "smc-gcd", 4, -10.0, 42),
            row("a", "smc-lookahead", 4, -16.0, 30, n=0),
            row("b", "smc-gcd", 1, -4.0, 20), row("b", "smc-gcd", 4, -2.0, 22),
            row("b", "smc-lookahead", 4, -3.0, 10),
            row("c", "smc-gcd", 4, -5.0, 30), row("c", "smc-lookahead", 4, -math.inf, 12, n=1)]
    rows[-1]["output"] += "x"                                  # unparsable: no argument count
    d = {(e["method"], e["particles"]): e for e in proposal_diagnostics(rows)}
    assert d[("smc-gcd", 1)]["log_Z_vs_ref_median"] == -0.5          # +1 and -2 against k = 4
    assert d[("smc-gcd", 4)]["log_Z_vs_ref_median"] == 0.0
    assert d[("smc-lookahead", 4)]["log_Z_vs_ref_median"] == -3.5    # -6 and -1; c: -inf left out
    assert d[("smc-lookahead", 4)]["n_log_Z"] == 2
    assert d[("smc-lookahead", 4)]["tokens_mean"] == (30 + 10 + 12) / 3
    assert d[("smc-lookahead", 4)]["arguments_mean"] == 1.0            # 0 and 2; c unparsable
    assert d[("smc-gcd", 4)]["arguments_mean"] == 2.0
    md = diagnostics_md(list(d.values()))
    assert "SMC-GCD at k = 4" in md and "| json | P-GCD lookahead (SMC) | 4 | 17.33 | 1.00 | -3.50 | 2 |" in md

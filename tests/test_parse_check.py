"""Study 1's independent check of constraint satisfaction (BFCL's own parser on every
output): counts per format and satisfied/unsatisfied, on hand-made rows."""

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

"""The NIH reader on the messy shapes the real files come in."""

from pathlib import Path

import pytest

from chexnet_utils.data.nih import (
    CSV_NAME,
    TEST_LIST,
    TRAIN_VAL_LIST,
    DataFormatError,
    ImageRecord,
    LeakageError,
    NIHDataset,
    check_no_leakage,
    class_prevalence,
    find_images,
    patient_split,
    read_data_entry,
    read_split_list,
    write_data_entry,
    write_split_list,
)

REAL_HEADER = ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,"
               "View Position,OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]")
REAL_ROWS = [  # the first rows of the real Data_Entry_2017.csv
    "00000001_000.png,Cardiomegaly,0,1,58,M,PA,2682,2749,0.143,0.143",
    "00000001_001.png,Cardiomegaly|Emphysema,1,1,58,M,PA,2894,2729,0.143,0.143",
    "00000001_002.png,Cardiomegaly|Effusion,2,1,58,M,PA,2500,2048,0.168,0.168",
    "00000002_000.png,No Finding,0,2,81,M,PA,2500,2048,0.171,0.171",
    "00000003_000.png,Hernia,0,3,81,F,PA,2582,2991,0.143,0.143",
]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_the_real_layout(tmp_path):
    recs = read_data_entry(write(tmp_path / CSV_NAME, [REAL_HEADER, *REAL_ROWS]))
    assert [r.image_index for r in recs][:2] == ["00000001_000.png", "00000001_001.png"]
    r = recs[1]
    assert r.finding_labels == "Cardiomegaly|Emphysema"
    assert (r.follow_up, r.patient_id, r.patient_age, r.patient_gender) == (1, 1, 58, "M")
    assert (r.width, r.height, r.spacing_x) == (2894, 2729, 0.143)
    assert r.labels.sum() == 2


def test_trailing_comma_copies_and_patient_sex(tmp_path):
    header = REAL_HEADER.replace("Patient Gender", "Patient Sex") + ","
    rows = [row + "," for row in REAL_ROWS]
    recs = read_data_entry(write(tmp_path / CSV_NAME, [header, *rows]))
    assert len(recs) == 5 and recs[4].patient_gender == "F"
    assert recs[4].finding_labels == "Hernia"


def test_old_age_format(tmp_path):
    recs = read_data_entry(write(tmp_path / CSV_NAME,
                                 [REAL_HEADER, REAL_ROWS[0].replace(",58,", ",058Y,")]))
    assert recs[0].patient_age == 58


def test_extra_fields_are_an_error(tmp_path):
    with pytest.raises(DataFormatError, match=r"row 2: expected 11 fields, got 13"):
        read_data_entry(write(tmp_path / CSV_NAME, [REAL_HEADER, REAL_ROWS[0] + ",EXTRA,MORE"]))


def test_ages_in_months_and_days(tmp_path):
    rows = [REAL_ROWS[0].replace(",58,", ",018M,"), REAL_ROWS[3].replace(",81,", ",400D,")]
    recs = read_data_entry(write(tmp_path / CSV_NAME, [REAL_HEADER, *rows]))
    assert [r.patient_age for r in recs] == [1, 1]


def test_missing_column_names_file_and_row(tmp_path):
    path = write(tmp_path / CSV_NAME, ["Image Index,Finding Labels,Patient ID", "a.png,Mass,1"])
    with pytest.raises(DataFormatError, match=rf"{CSV_NAME}, row 1: missing column") as e:
        read_data_entry(path)
    assert "Follow-up #" in str(e.value)


def test_unknown_label_names_file_and_row(tmp_path):
    rows = list(REAL_ROWS)
    rows[2] = rows[2].replace("Effusion", "Efusion")
    with pytest.raises(DataFormatError, match=r"row 4: unknown label 'Efusion'"):
        read_data_entry(write(tmp_path / CSV_NAME, [REAL_HEADER, *rows]))


def test_duplicate_image_names_file_and_row(tmp_path):
    with pytest.raises(DataFormatError, match=r"row 7: duplicate image name '00000001_000.png' "
                                              r"\(first seen in row 2\)"):
        read_data_entry(write(tmp_path / CSV_NAME, [REAL_HEADER, *REAL_ROWS, REAL_ROWS[0]]))


def test_row_without_image_name(tmp_path):
    with pytest.raises(DataFormatError, match="row 3: row has no image name"):
        read_data_entry(write(tmp_path / CSV_NAME,
                              [REAL_HEADER, REAL_ROWS[0], "," + REAL_ROWS[1].split(",", 1)[1]]))


def test_bad_number(tmp_path):
    with pytest.raises(DataFormatError, match="row 2: Patient ID is not a whole number"):
        read_data_entry(write(tmp_path / CSV_NAME,
                              [REAL_HEADER, REAL_ROWS[0].replace(",1,58", ",x,58")]))


def test_missing_csv(tmp_path):
    with pytest.raises(DataFormatError, match="metadata file not found"):
        read_data_entry(tmp_path / CSV_NAME)


def test_write_then_read_is_identity(tmp_path):
    recs = read_data_entry(write(tmp_path / "a.csv", [REAL_HEADER, *REAL_ROWS]))
    write_data_entry(tmp_path / "b.csv", recs)
    assert (tmp_path / "b.csv").read_text().splitlines()[0] == REAL_HEADER
    assert read_data_entry(tmp_path / "b.csv") == recs


def test_split_lists(tmp_path):
    write_split_list(tmp_path / TEST_LIST, ["b.png", "a.png"])
    assert read_split_list(tmp_path / TEST_LIST) == ["b.png", "a.png"]
    with pytest.raises(DataFormatError, match="split list not found"):
        read_split_list(tmp_path / TRAIN_VAL_LIST)
    write(tmp_path / TRAIN_VAL_LIST, ["a.png", "c.png", "a.png"])
    with pytest.raises(DataFormatError, match=r"row 3: image 'a.png' listed twice"):
        read_split_list(tmp_path / TRAIN_VAL_LIST)


def make_layout(root: Path, nested: bool) -> None:
    write(root / CSV_NAME, [REAL_HEADER, *REAL_ROWS])
    names = [r.split(",")[0] for r in REAL_ROWS]
    for i, name in enumerate(names):
        folder = root / (f"images_{1 + i // 3:03d}/images" if nested else "images")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"png")
    write_split_list(root / TRAIN_VAL_LIST, names[:3])
    write_split_list(root / TEST_LIST, names[3:])


@pytest.mark.parametrize("nested", [True, False])
def test_dataset_finds_images_in_both_layouts(tmp_path, nested):
    make_layout(tmp_path, nested)
    ds = NIHDataset.load(tmp_path)
    assert len(ds.records) == 5 and ds.missing_images() == []
    assert ds.image_paths["00000003_000.png"].exists()
    assert ds.labels().shape == (5, 14)


def test_dataset_reports_missing_images(tmp_path):
    make_layout(tmp_path, nested=True)
    next((tmp_path / "images_002" / "images").glob("*.png")).unlink()
    assert len(NIHDataset.load(tmp_path).missing_images()) == 1


def test_dataset_missing_list_is_an_error_unless_optional(tmp_path):
    make_layout(tmp_path, nested=False)
    (tmp_path / TEST_LIST).unlink()
    with pytest.raises(DataFormatError, match=TEST_LIST):
        NIHDataset.load(tmp_path)
    assert NIHDataset.load(tmp_path, require_split_lists=False).test_names == []


def test_dataset_list_names_unknown_image(tmp_path):
    make_layout(tmp_path, nested=False)
    write_split_list(tmp_path / TEST_LIST, ["99999999_000.png"])
    with pytest.raises(DataFormatError, match="not in Data_Entry_2017.csv"):
        NIHDataset.load(tmp_path)


def test_image_in_both_lists(tmp_path):
    make_layout(tmp_path, nested=False)
    write_split_list(tmp_path / TEST_LIST, ["00000001_000.png"])
    with pytest.raises(DataFormatError, match="also in train_val_list.txt"):
        NIHDataset.load(tmp_path)


def test_same_name_in_two_folders(tmp_path):
    for d in ("images", "images_001/images"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "x.png").write_bytes(b"")
    with pytest.raises(DataFormatError, match="also found at"):
        find_images(tmp_path)


def records(n_patients: int, per_patient: int) -> list[ImageRecord]:
    return [ImageRecord(f"{p:08d}_{k:03d}.png", "Mass" if (p + k) % 3 == 0 else "No Finding",
                        k, p, 40, "F", "PA") for p in range(1, n_patients + 1)
            for k in range(per_patient)]


def test_patient_split_has_no_leakage_and_covers_everything():
    recs = records(200, 3)
    split = patient_split(recs, val_fraction=0.1, test_fraction=0.2, seed=1)
    parts = split.parts()
    assert sum(len(v) for v in parts.values()) == len(recs)
    assert {r.image_index for v in parts.values() for r in v} == {r.image_index for r in recs}
    pids = [{r.patient_id for r in v} for v in parts.values()]
    assert not (pids[0] & pids[1] or pids[0] & pids[2] or pids[1] & pids[2])
    assert 0.15 < len(split.test) / len(recs) < 0.25
    assert patient_split(recs, seed=1).test == split.test  # deterministic
    assert patient_split(recs, seed=2).test != split.test


def test_split_with_official_test_list():
    recs = records(50, 2)
    test_names = [r.image_index for r in recs if r.patient_id <= 10]
    split = patient_split(recs, 0.1, seed=0, test_names=test_names)
    assert sorted(r.image_index for r in split.test) == sorted(test_names)
    split.check_no_leakage()
    # val is 10 % of the 40 remaining patients, whatever share of images the test list has
    assert len({r.patient_id for r in split.val}) == 4


def test_leakage_is_detected_and_named():
    recs = records(3, 2)
    with pytest.raises(LeakageError, match=r"patient 1 in \['test', 'train'\]"):
        check_no_leakage({"train": recs[:1], "test": recs[1:2]})
    # an image-level split of a patient with two images is exactly this leak
    with pytest.raises(LeakageError):
        patient_split(recs, test_names=[recs[0].image_index])


def test_prevalence():
    prev = class_prevalence(records(30, 1))
    assert prev["Mass"] == pytest.approx(10 / 30)
    assert prev["No Finding"] == pytest.approx(20 / 30)
    assert prev["Hernia"] == 0.0

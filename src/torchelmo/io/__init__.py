"""Files in and out, for any part: cached, checked downloads (:mod:`.download`), atomic and
bounded file access (:mod:`.fileio`) and sentence files (:mod:`.text`)."""

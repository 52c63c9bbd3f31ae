//! Small programs that show the pmd API; see the `src/bin` folder.

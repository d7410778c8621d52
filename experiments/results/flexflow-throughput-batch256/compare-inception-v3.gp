# parasol compare: best predicted iteration time against search time.
$a0 << EOD
0.013955 313.133697
4.890585 313.133697

EOD
$a1 << EOD
0.004158 313.133697
4.784494 313.133697

EOD
$a2 << EOD
0.025305 313.133697
4.769601 313.133697

EOD
$a3 << EOD
0.003874 313.133697
4.757723 313.133697

EOD
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
  set terminal pngcairo size 960,600 font ',11'
} else {
  set terminal png size 960,600
}
set output 'compare-inception-v3.png'
set title 'inception-v3 on flexflow-p100' noenhanced
set xlabel 'search time (s)'
set ylabel 'best predicted iteration time (ms)'
set key outside right top noenhanced
set grid
plot $a0 using 1:2 with steps linewidth 2 linecolor 1 title 'mcmc', \
     $a1 using 1:2 with steps linewidth 2 linecolor 2 title 'optcnn', \
     $a2 using 1:2 with steps linewidth 2 linecolor 3 title 'dp', \
     $a3 using 1:2 with steps linewidth 2 linecolor 4 title 'beam', \
     313.133697 with lines dashtype 2 linecolor 'gray' title 'data parallel'
